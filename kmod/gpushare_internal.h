/* SPDX-License-Identifier: GPL-2.0 */
/*
 * gpushare - internal declarations shared by the module's files.
 */
#ifndef GPUSHARE_INTERNAL_H
#define GPUSHARE_INTERNAL_H

#include <linux/types.h>
#include <linux/hashtable.h>
#include <linux/refcount.h>
#include <linux/spinlock.h>
#include <linux/wait.h>
#include <linux/atomic.h>
#include <linux/version.h>
#include <linux/bitops.h>
#include <linux/ioctl.h>

#include "include/gpushare_kmod.h"

/* The major number follows the netlink protocol version. */
#define GPUSHARE_MODULE_VERSION "2.0.0"

/* ---- kernel-version workarounds, all in one place ---------------------- */

#if LINUX_VERSION_CODE < KERNEL_VERSION(5, 10, 0)
#error "gpushare needs Linux 5.10 or newer"
#endif

/*
 * The ftrace callback is recursion-safe by construction (it issues no ioctl,
 * and the wrapper's call of the original is recognised by parent_ip), so it
 * asks ftrace for no recursion protection, which would cost every ioctl on
 * the system about 27 more instructions: 5.10 says so with
 * FTRACE_OPS_FL_RECURSION_SAFE, 5.11+ by leaving out FTRACE_OPS_FL_RECURSION.
 */
#if LINUX_VERSION_CODE < KERNEL_VERSION(5, 11, 0)
#define GPUSHARE_FTRACE_REGS struct pt_regs
#define gpushare_ftrace_regs(fregs) (fregs)
#define GPUSHARE_FTRACE_FLAGS (FTRACE_OPS_FL_SAVE_REGS | \
			       FTRACE_OPS_FL_IPMODIFY | \
			       FTRACE_OPS_FL_RECURSION_SAFE)
#else
#define GPUSHARE_FTRACE_REGS struct ftrace_regs
#define gpushare_ftrace_regs(fregs) ftrace_get_regs(fregs)
#define GPUSHARE_FTRACE_FLAGS (FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_IPMODIFY)
#endif

#ifndef fd_file
/* Before 6.12 struct fd exposes its file directly. */
#define fd_file(f) ((f).file)
#endif

/* ---- module parameters (gpushare_main.c) -------------------------------- */

extern unsigned int gpushare_timeout_ms;
extern unsigned int gpushare_max_hold_ms;
extern unsigned int gpushare_max_entries;

/* ---- container_map (gpushare_map.c) -------------------------------------- */

#define GPUSHARE_MAP_BITS 10

struct pid_namespace;

struct gpushare_entry {
	struct hlist_node node;		/* in gpushare_map, RCU */
	struct rcu_head rcu;
	refcount_t ref;			/* the map's reference + one per user */
	u64 pidns;
	struct pid_namespace *ns;	/* referenced while in the map: the id
					 * cannot be handed out again */
	unsigned long flags;		/* GPUSHARE_BIT_* */
	spinlock_t lock;		/* reclaim state below */
	bool reclaiming;
	bool dead;			/* deleted from the map */
	u64 reclaim_gen;
	u64 deadline_ns;		/* when the reclaim ends (ktime) */
	struct gpushare_kmod_notice hit;	/* the hit that started it */
	wait_queue_head_t wq;
	atomic_t blocked;
	atomic64_t last_access_ns;
	atomic64_t hits;
	atomic64_t notices;
	atomic64_t releases;
	atomic64_t timeouts;
	atomic64_t holds;
};

#define GPUSHARE_BIT_WATCHED 0
#define GPUSHARE_BIT_NEED_NOTICE 1

int gpushare_map_init(void);
void gpushare_map_exit(void);
bool gpushare_map_contains(u64 pidns);
struct gpushare_entry *gpushare_map_get(u64 pidns);
void gpushare_entry_put(struct gpushare_entry *e);
int gpushare_map_add(const struct gpushare_kmod_target *t, bool detect);
int gpushare_map_delete(u64 pidns);
int gpushare_map_undetect(u64 pidns);
int gpushare_map_release(u64 pidns);
int gpushare_map_hold(u64 pidns);
int gpushare_map_resend(void);
unsigned int gpushare_map_count(void);
int gpushare_map_stats(const u64 *ids, u32 n, struct gpushare_kmod_stats *out,
		       u32 max);
void gpushare_map_wake_all(void);

/* ---- ioctl filter (gpushare_filter.c) ------------------------------------ */

int gpushare_config_set(const struct gpushare_kmod_config *cfg);
void gpushare_config_get(struct gpushare_kmod_config *cfg);
int gpushare_config_init(const u8 *types, unsigned int ntypes,
			 const unsigned int *majors, unsigned int nmajors);
void gpushare_config_exit(void);
extern unsigned long gpushare_watched_types[BITS_TO_LONGS(256)];

/* Hot path: one bit test, no lock. */
static inline bool gpushare_type_watched(unsigned int cmd)
{
	return test_bit(_IOC_TYPE(cmd), gpushare_watched_types);
}
bool gpushare_file_watched(unsigned int fd);

/* ---- hooks (gpushare_hook.c) --------------------------------------------- */

extern bool gpushare_unloading;

int gpushare_hooks_init(void);
void gpushare_hooks_exit(void);

/* ---- netlink (gpushare_netlink.c) ---------------------------------------- */

int gpushare_netlink_init(int unit);
void gpushare_netlink_exit(void);
void gpushare_notify(const struct gpushare_kmod_notice *notice);

#endif /* GPUSHARE_INTERNAL_H */
