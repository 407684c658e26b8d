"""Dynamic Resource Allocation in the sim: the CEL subset, the allocator, the scheduler's
claim handling (:mod:`.scheduling`) and the kubelet's plugin side (``node.adapters.dra``)."""
