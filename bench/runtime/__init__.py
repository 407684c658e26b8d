"""gpushare-runtime benchmarks."""
