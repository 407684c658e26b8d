"""The chaos soak: python -m gpushare_sim.soak."""
