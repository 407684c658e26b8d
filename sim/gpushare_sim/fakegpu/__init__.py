"""Fake GPUs for the node simulator: card device nodes, a CDI spec, the vendor
device plugin (``nvidia.com/gpu``) and a DCGM-style metrics exporter."""
