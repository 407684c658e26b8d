"""gpushare's Dynamic Resource Allocation driver (``gpushare.k8s.io``)."""
