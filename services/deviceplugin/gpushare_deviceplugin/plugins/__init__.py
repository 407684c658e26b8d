"""Plugin objects (start/stop/devices) and the supervisor that keeps them registered."""
