"""Large clusters: an emulated fleet of GPU nodes on a 3-server NATS cluster (``python -m bench.fleet``)."""
