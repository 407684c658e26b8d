"""``python -m gpushare_sim.run``: the whole system on the simulator, narrated (``make run``)."""
