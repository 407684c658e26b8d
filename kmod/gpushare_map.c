// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare container_map: pid-namespace id -> entry.
 *
 * Readers (the ioctl hook) walk the hash table under RCU and take a
 * reference with refcount_inc_not_zero(); they never take a global lock.
 * Writers (netlink commands, module exit) serialise on gpushare_map_mutex.
 * An entry is freed after an RCU grace period once its last reference goes.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/rculist.h>
#include <linux/sched.h>
#include <linux/jiffies.h>

#include "gpushare_internal.h"

static DEFINE_HASHTABLE(gpushare_map, GPUSHARE_MAP_BITS);
static DEFINE_MUTEX(gpushare_map_mutex);
static unsigned int gpushare_map_entries;

int gpushare_map_init(void)
{
	hash_init(gpushare_map);
	gpushare_map_entries = 0;
	return 0;
}

static struct gpushare_entry *gpushare_map_find_locked(u64 pidns)
{
	struct gpushare_entry *e;

	hash_for_each_possible(gpushare_map, e, node, pidns)
		if (e->pidns == pidns)
			return e;
	return NULL;
}

/*
 * Hot path (the ftrace callback): no reference taken, nothing traced. A
 * preempt-disabled section is an RCU reader for kfree_rcu() since 4.20.
 */
bool notrace gpushare_map_contains(u64 pidns)
{
	struct gpushare_entry *e;
	bool found = false;

	rcu_read_lock_sched_notrace();
	hash_for_each_possible_rcu_notrace(gpushare_map, e, node, pidns) {
		if (e->pidns == pidns) {
			found = true;
			break;
		}
	}
	rcu_read_unlock_sched_notrace();
	return found;
}

struct gpushare_entry *gpushare_map_get(u64 pidns)
{
	struct gpushare_entry *e, *found = NULL;

	rcu_read_lock();
	hash_for_each_possible_rcu(gpushare_map, e, node, pidns) {
		if (e->pidns == pidns && refcount_inc_not_zero(&e->ref)) {
			found = e;
			break;
		}
	}
	rcu_read_unlock();
	return found;
}

void gpushare_entry_put(struct gpushare_entry *e)
{
	if (refcount_dec_and_test(&e->ref))
		kfree_rcu(e, rcu);
}

static struct gpushare_entry *gpushare_entry_new(u64 pidns)
{
	struct gpushare_entry *e = kzalloc(sizeof(*e), GFP_KERNEL);

	if (!e)
		return NULL;
	e->pidns = pidns;
	refcount_set(&e->ref, 1);
	spin_lock_init(&e->lock);
	init_waitqueue_head(&e->wq);
	return e;
}

int gpushare_map_add(u64 pidns, bool detect)
{
	struct gpushare_entry *e;
	int ret = 0;

	mutex_lock(&gpushare_map_mutex);
	e = gpushare_map_find_locked(pidns);
	if (!e) {
		if (gpushare_map_entries >= gpushare_max_entries) {
			ret = -ENOSPC;
			goto out;
		}
		e = gpushare_entry_new(pidns);
		if (!e) {
			ret = -ENOMEM;
			goto out;
		}
		set_bit(GPUSHARE_BIT_WATCHED, &e->flags);
		hash_add_rcu(gpushare_map, &e->node, pidns);
		gpushare_map_entries++;
	}
	if (detect)
		set_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags);
out:
	mutex_unlock(&gpushare_map_mutex);
	return ret;
}

/* Ends a reclaim and wakes its waiters; returns how many were blocked. */
static int gpushare_entry_wake(struct gpushare_entry *e, bool dead)
{
	bool ended;

	spin_lock(&e->lock);
	ended = e->reclaiming;
	e->reclaiming = false;
	if (dead)
		e->dead = true;
	spin_unlock(&e->lock);
	if (ended && !dead)
		atomic64_inc(&e->releases);
	wake_up_all(&e->wq);
	return atomic_read(&e->blocked);
}

int gpushare_map_delete(u64 pidns)
{
	struct gpushare_entry *e;
	int woken = 0;

	mutex_lock(&gpushare_map_mutex);
	e = gpushare_map_find_locked(pidns);
	if (e) {
		hash_del_rcu(&e->node);
		gpushare_map_entries--;
	}
	mutex_unlock(&gpushare_map_mutex);
	if (e) {
		woken = gpushare_entry_wake(e, true);
		gpushare_entry_put(e);
	}
	return woken;
}

int gpushare_map_undetect(u64 pidns)
{
	struct gpushare_entry *e = gpushare_map_get(pidns);

	if (e) {
		clear_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags);
		gpushare_entry_put(e);
	}
	return 0;
}

int gpushare_map_release(u64 pidns)
{
	struct gpushare_entry *e = gpushare_map_get(pidns);
	int woken = 0;

	if (e) {
		woken = gpushare_entry_wake(e, false);
		gpushare_entry_put(e);
	}
	return woken;
}

unsigned int gpushare_map_count(void)
{
	return READ_ONCE(gpushare_map_entries);
}

static void gpushare_entry_stats(struct gpushare_entry *e,
				 struct gpushare_kmod_stats *s)
{
	memset(s, 0, sizeof(*s));
	s->pidns = e->pidns;
	s->last_access_ns = atomic64_read(&e->last_access_ns);
	s->hits = atomic64_read(&e->hits);
	s->notices = atomic64_read(&e->notices);
	s->releases = atomic64_read(&e->releases);
	s->timeouts = atomic64_read(&e->timeouts);
	s->blocked = atomic_read(&e->blocked);
	if (test_bit(GPUSHARE_BIT_WATCHED, &e->flags))
		s->flags |= GPUSHARE_KMOD_F_WATCHED;
	if (test_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags))
		s->flags |= GPUSHARE_KMOD_F_NEED_NOTICE;
	if (READ_ONCE(e->reclaiming) &&
	    time_before(jiffies, READ_ONCE(e->deadline)))
		s->flags |= GPUSHARE_KMOD_F_RECLAIMING;
}

/* Fills up to max records, for ids (n > 0) or for every entry (n == 0). */
int gpushare_map_stats(const u64 *ids, u32 n, struct gpushare_kmod_stats *out,
		       u32 max)
{
	struct gpushare_entry *e;
	u32 i, filled = 0;
	int bkt;

	rcu_read_lock();
	if (n) {
		for (i = 0; i < n && filled < max; i++) {
			hash_for_each_possible_rcu(gpushare_map, e, node, ids[i])
				if (e->pidns == ids[i]) {
					gpushare_entry_stats(e, &out[filled++]);
					break;
				}
		}
	} else {
		hash_for_each_rcu(gpushare_map, bkt, e, node) {
			if (filled >= max)
				break;
			gpushare_entry_stats(e, &out[filled++]);
		}
	}
	rcu_read_unlock();
	return filled;
}

/* Module exit: wakes every blocked task (they see gpushare_unloading). */
void gpushare_map_wake_all(void)
{
	struct gpushare_entry *e;
	int bkt;

	mutex_lock(&gpushare_map_mutex);
	hash_for_each(gpushare_map, bkt, e, node)
		wake_up_all(&e->wq);
	mutex_unlock(&gpushare_map_mutex);
}

void gpushare_map_exit(void)
{
	struct gpushare_entry *e;
	struct hlist_node *tmp;
	int bkt;

	mutex_lock(&gpushare_map_mutex);
	hash_for_each_safe(gpushare_map, bkt, tmp, e, node) {
		hash_del_rcu(&e->node);
		gpushare_map_entries--;
		gpushare_entry_wake(e, true);
		gpushare_entry_put(e);
	}
	mutex_unlock(&gpushare_map_mutex);
}
