"""gpushare console: the cluster view in the browser (fleet, nodes, evictions), read-only."""
