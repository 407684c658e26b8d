"""gpushare kmod-bridge: netlink to the kernel module, pid-namespace notices to owner-back events."""
