"""The node simulator's adapters: the only modules that touch gRPC, the
Kubernetes client, containerd and processes."""
