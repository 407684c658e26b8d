// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare ioctl filter: watched _IOC_TYPE values and character-device
 * majors, replaced at run time by the CONFIG command. Readers use RCU only.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/file.h>
#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/mutex.h>
#include <linux/rcupdate.h>
#include <linux/slab.h>

#include "gpushare_internal.h"

struct gpushare_filter {
	DECLARE_BITMAP(types, 256);
	struct gpushare_kmod_config cfg;	/* as configured */
	struct rcu_head rcu;
};

static struct gpushare_filter __rcu *gpushare_filter;
/* Copy of the current types, read word by word by the ftrace callback. */
unsigned long gpushare_watched_types[BITS_TO_LONGS(256)];
static DEFINE_MUTEX(gpushare_filter_mutex);

static int gpushare_config_check(const struct gpushare_kmod_config *cfg)
{
	u32 i;

	if (cfg->ntypes > GPUSHARE_KMOD_MAX_TYPES ||
	    cfg->nmajors > GPUSHARE_KMOD_MAX_MAJORS)
		return -EINVAL;
	for (i = 0; i < cfg->nmajors; i++)
		if (cfg->majors[i] >= GPUSHARE_KMOD_MAJOR_LIMIT)
			return -EINVAL;
	return 0;
}

int gpushare_config_set(const struct gpushare_kmod_config *cfg)
{
	struct gpushare_filter *f, *old;
	u32 i;
	int ret = gpushare_config_check(cfg);

	if (ret)
		return ret;
	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->cfg = *cfg;
	for (i = 0; i < cfg->ntypes; i++)
		__set_bit(cfg->types[i], f->types);
	mutex_lock(&gpushare_filter_mutex);
	old = rcu_replace_pointer(gpushare_filter, f,
				  lockdep_is_held(&gpushare_filter_mutex));
	for (i = 0; i < ARRAY_SIZE(gpushare_watched_types); i++)
		WRITE_ONCE(gpushare_watched_types[i], f->types[i]);
	mutex_unlock(&gpushare_filter_mutex);
	if (old)
		kfree_rcu(old, rcu);
	return 0;
}

void gpushare_config_get(struct gpushare_kmod_config *cfg)
{
	rcu_read_lock();
	*cfg = rcu_dereference(gpushare_filter)->cfg;
	rcu_read_unlock();
}

int gpushare_config_init(const u8 *types, unsigned int ntypes,
			 const unsigned int *majors, unsigned int nmajors)
{
	struct gpushare_kmod_config cfg = {};
	unsigned int i;

	cfg.ntypes = ntypes;
	cfg.nmajors = nmajors;
	for (i = 0; i < ntypes && i < GPUSHARE_KMOD_MAX_TYPES; i++)
		cfg.types[i] = types[i];
	for (i = 0; i < nmajors && i < GPUSHARE_KMOD_MAX_MAJORS; i++)
		cfg.majors[i] = majors[i];
	return gpushare_config_set(&cfg);
}

void gpushare_config_exit(void)
{
	struct gpushare_filter *f;

	mutex_lock(&gpushare_filter_mutex);
	f = rcu_replace_pointer(gpushare_filter, NULL,
				lockdep_is_held(&gpushare_filter_mutex));
	mutex_unlock(&gpushare_filter_mutex);
	synchronize_rcu();
	kfree(f);
}


static bool gpushare_major_in(const struct gpushare_kmod_config *cfg,
			      unsigned int major)
{
	u32 i;

	for (i = 0; i < cfg->nmajors; i++)
		if (cfg->majors[i] == major)
			return true;
	return false;
}

bool gpushare_file_watched(unsigned int fd)
{
	struct gpushare_kmod_config cfg;
	struct inode *inode;
	struct fd f;
	bool watched;

	gpushare_config_get(&cfg);
	if (!cfg.nmajors)
		return true;
	f = fdget(fd);
	if (!fd_file(f))
		return false;
	inode = file_inode(fd_file(f));
	watched = S_ISCHR(inode->i_mode) &&
		  gpushare_major_in(&cfg, MAJOR(inode->i_rdev));
	fdput(f);
	return watched;
}
