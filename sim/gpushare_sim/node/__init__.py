"""The node simulator: one process per simulated node, standing in for the
kubelet (device plugin registration, device manager, pod-resources API, pod
lifecycle through containerd or plain processes) with fake GPUs and their
DCGM-style exporter.  Run: ``python -m gpushare_sim.node --name NODE --api
KUBECONFIG --dir SIMDIR --gpus 4``."""
