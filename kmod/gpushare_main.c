// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare - owner-back detection for shared GPUs.
 *
 * Watches GPU ioctls per pid namespace; when user space has put a namespace
 * in detect mode, the first such ioctl sends a netlink notice and blocks the
 * caller until user space releases the namespace (the borrowers of its card
 * are gone), the timeout passes, or a fatal signal arrives.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/netlink.h>

#include "gpushare_internal.h"

static int nl_unit = GPUSHARE_KMOD_NETLINK_UNIT;
module_param(nl_unit, int, 0444);
MODULE_PARM_DESC(nl_unit, "netlink protocol number (default 31)");

/*
 * timeout_ms and max_hold_ms may be written at run time through
 * /sys/module/gpushare/parameters/: a value outside
 * 1..GPUSHARE_KMOD_MAX_PARAM_MS (or not a number) is refused with -EINVAL
 * and the old value stays. Readers take them with READ_ONCE().
 */
static int gpushare_param_set_ms(const char *val, const struct kernel_param *kp)
{
	unsigned int ms;
	int ret = kstrtouint(val, 0, &ms);

	if (ret)
		return -EINVAL;
	if (!ms || ms > GPUSHARE_KMOD_MAX_PARAM_MS)
		return -EINVAL;
	WRITE_ONCE(*(unsigned int *)kp->arg, ms);
	return 0;
}

static const struct kernel_param_ops gpushare_param_ms_ops = {
	.set = gpushare_param_set_ms,
	.get = param_get_uint,
};

unsigned int gpushare_timeout_ms = 3000;
module_param_cb(timeout_ms, &gpushare_param_ms_ops, &gpushare_timeout_ms, 0644);
MODULE_PARM_DESC(timeout_ms, "an owner's ioctl is held this long after the hit, or after a HOLD, unless released, ms (1..600000, default 3000)");

/*
 * 30 s: ten default timeouts. A GPU driver frees the memory of a killed
 * borrower in seconds even for tens of GiB, so HOLDs normally end well
 * before; the bound only matters when user space keeps holding for a
 * borrower that does not die (stuck in the driver) or holds by mistake,
 * and then the owner's call still continues within half a minute instead
 * of hanging with it.
 */
unsigned int gpushare_max_hold_ms = 30000;
module_param_cb(max_hold_ms, &gpushare_param_ms_ops, &gpushare_max_hold_ms, 0644);
MODULE_PARM_DESC(max_hold_ms, "HOLD never keeps an owner's ioctl past this long after the hit, ms (1..600000, default 30000)");

unsigned int gpushare_max_entries = 4096;
module_param_named(max_entries, gpushare_max_entries, uint, 0444);
MODULE_PARM_DESC(max_entries, "most pid namespaces in container_map (default 4096)");

static ushort watch_types[GPUSHARE_KMOD_MAX_TYPES] = { 0x46 };
static unsigned int n_watch_types = 1;
module_param_array(watch_types, ushort, &n_watch_types, 0444);
MODULE_PARM_DESC(watch_types, "watched _IOC_TYPE values at load (default 0x46)");

static unsigned int watch_majors[GPUSHARE_KMOD_MAX_MAJORS];
static unsigned int n_watch_majors;
module_param_array(watch_majors, uint, &n_watch_majors, 0444);
MODULE_PARM_DESC(watch_majors, "watched character-device majors at load (default any file)");

static int gpushare_params_check(void)
{
	unsigned int i;

	if (nl_unit < 0 || nl_unit >= MAX_LINKS)
		return -EINVAL;
	if (!gpushare_max_entries || gpushare_max_entries > 65536)
		return -EINVAL;
	for (i = 0; i < n_watch_types; i++)
		if (watch_types[i] > 0xff)
			return -EINVAL;
	return 0;
}

static int gpushare_config_from_params(void)
{
	u8 types[GPUSHARE_KMOD_MAX_TYPES];
	unsigned int i;

	for (i = 0; i < n_watch_types; i++)
		types[i] = watch_types[i];
	return gpushare_config_init(types, n_watch_types, watch_majors,
				    n_watch_majors);
}

static int __init gpushare_init(void)
{
	int ret = gpushare_params_check();

	if (ret) {
		pr_err("invalid module parameters\n");
		return ret;
	}
	ret = gpushare_map_init();
	if (ret)
		goto err_map;
	ret = gpushare_config_from_params();
	if (ret)
		goto err_config;
	ret = gpushare_netlink_init(nl_unit);
	if (ret)
		goto err_netlink;
	ret = gpushare_hooks_init();
	if (ret)
		goto err_hooks;
	pr_info("loaded, version %s, netlink %d, timeout %u ms, max hold %u ms\n",
		GPUSHARE_MODULE_VERSION, nl_unit, gpushare_timeout_ms,
		gpushare_max_hold_ms);
	return 0;

err_hooks:
	gpushare_netlink_exit();
err_netlink:
	gpushare_config_exit();
err_config:
	gpushare_map_exit();
err_map:
	return ret;
}

static void __exit gpushare_exit(void)
{
	gpushare_hooks_exit();
	gpushare_netlink_exit();
	gpushare_config_exit();
	gpushare_map_exit();
	pr_info("unloaded\n");
}

module_init(gpushare_init);
module_exit(gpushare_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpushare: notify and block a GPU owner's ioctls until its card is released");
MODULE_VERSION(GPUSHARE_MODULE_VERSION);
