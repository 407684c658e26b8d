// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare container_map: pid-namespace id -> entry.
 *
 * Readers (the ioctl hook) walk the hash table under RCU and take a
 * reference with refcount_inc_not_zero(); they never take a global lock.
 * Writers (netlink commands, module exit) serialise on gpushare_map_mutex.
 * An entry is freed after an RCU grace period once its last reference goes.
 *
 * Each entry holds a reference on its pid namespace from ADD/DETECT until
 * DELETE (or unload): the namespace's inode number, which is the map's key,
 * is only handed out again once the namespace is freed, so while an entry
 * exists no new namespace can inherit it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/slab.h>
#include <linux/mutex.h>
#include <linux/rculist.h>
#include <linux/sched.h>
#include <linux/ktime.h>
#include <linux/pid.h>
#include <linux/pid_namespace.h>

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

static struct gpushare_entry *gpushare_entry_new(u64 pidns,
					      struct pid_namespace *ns)
{
	struct gpushare_entry *e = kzalloc(sizeof(*e), GFP_KERNEL);

	if (!e)
		return NULL;
	e->pidns = pidns;
	e->ns = ns;
	refcount_set(&e->ref, 1);
	spin_lock_init(&e->lock);
	init_waitqueue_head(&e->wq);
	return e;
}

/*
 * The pid namespace of process pid (in the initial pid namespace), with a
 * reference, when its id is pidns: -ESRCH when there is no such process,
 * -ESTALE when it lives in another namespace. A struct pid keeps its
 * namespace until an RCU grace period after it is freed, so the reference
 * can be taken inside the read-side section that found it.
 */
static struct pid_namespace *gpushare_pidns_get(u64 pidns, u32 pid)
{
	struct pid_namespace *ns = ERR_PTR(-ESRCH);
	struct pid *p;

	rcu_read_lock();
	p = find_pid_ns(pid, &init_pid_ns);
	if (p && pid_task(p, PIDTYPE_PID)) {
		ns = ns_of_pid(p);
		ns = ns->ns.inum == pidns ? get_pid_ns(ns) : ERR_PTR(-ESTALE);
	}
	rcu_read_unlock();
	return ns;
}

/* Inserts an entry for pidns holding ns; called with the map mutex held. */
static int gpushare_map_insert(u64 pidns, struct pid_namespace *ns,
			       struct gpushare_entry **out)
{
	struct gpushare_entry *e;

	if (gpushare_map_entries >= gpushare_max_entries)
		return -ENOSPC;
	e = gpushare_entry_new(pidns, ns);
	if (!e)
		return -ENOMEM;
	set_bit(GPUSHARE_BIT_WATCHED, &e->flags);
	hash_add_rcu(gpushare_map, &e->node, pidns);
	gpushare_map_entries++;
	*out = e;
	return 0;
}

int gpushare_map_add(const struct gpushare_kmod_target *t, bool detect)
{
	struct pid_namespace *ns = gpushare_pidns_get(t->pidns, t->pid);
	struct gpushare_entry *e;
	int ret = 0;

	if (IS_ERR(ns))
		return PTR_ERR(ns);
	mutex_lock(&gpushare_map_mutex);
	e = gpushare_map_find_locked(t->pidns);
	if (!e) {
		ret = gpushare_map_insert(t->pidns, ns, &e);
		if (!ret)
			ns = NULL;	/* the entry holds it now */
	}
	if (!ret && detect)
		set_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags);
	mutex_unlock(&gpushare_map_mutex);
	if (ns)
		put_pid_ns(ns);	/* already held by the entry, or refused */
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

/* Drops the namespace of an entry that has left the map. */
static void gpushare_entry_unpin(struct gpushare_entry *e)
{
	struct pid_namespace *ns = xchg(&e->ns, NULL);

	if (ns)
		put_pid_ns(ns);
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
		gpushare_entry_unpin(e);
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

/*
 * Moves the deadline of a reclaim in progress to now + timeout_ms, capped at
 * hit + max_hold_ms; 1 when it moved, else 0. Waiters need no wake-up: each
 * reads the deadline again when its own sleep ends.
 */
int gpushare_map_hold(u64 pidns)
{
	struct gpushare_entry *e = gpushare_map_get(pidns);
	u64 now = ktime_get_ns(), want, limit;
	int moved = 0;

	if (!e)
		return 0;
	want = now + (u64)READ_ONCE(gpushare_timeout_ms) * NSEC_PER_MSEC;
	spin_lock(&e->lock);
	limit = e->hit.ts_ns + (u64)READ_ONCE(gpushare_max_hold_ms) * NSEC_PER_MSEC;
	if (e->reclaiming && !e->dead && now < e->deadline_ns &&
	    min(want, limit) > e->deadline_ns) {
		WRITE_ONCE(e->deadline_ns, min(want, limit));
		moved = 1;
	}
	spin_unlock(&e->lock);
	if (moved)
		atomic64_inc(&e->holds);
	gpushare_entry_put(e);
	return moved;
}

/* REGISTER: the notice of every reclaim in progress, again; how many. */
int gpushare_map_resend(void)
{
	struct gpushare_kmod_notice notice;
	struct gpushare_entry *e;
	int bkt, sent = 0;
	bool again;

	mutex_lock(&gpushare_map_mutex);
	hash_for_each(gpushare_map, bkt, e, node) {
		spin_lock(&e->lock);
		again = e->reclaiming && ktime_get_ns() < e->deadline_ns;
		notice = e->hit;
		spin_unlock(&e->lock);
		if (!again)
			continue;
		notice.flags = GPUSHARE_KMOD_NOTICE_F_RESENT;
		gpushare_notify(&notice);
		sent++;
	}
	mutex_unlock(&gpushare_map_mutex);
	return sent;
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
	s->holds = atomic64_read(&e->holds);
	s->blocked = atomic_read(&e->blocked);
	if (test_bit(GPUSHARE_BIT_WATCHED, &e->flags))
		s->flags |= GPUSHARE_KMOD_F_WATCHED;
	if (test_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags))
		s->flags |= GPUSHARE_KMOD_F_NEED_NOTICE;
	if (READ_ONCE(e->reclaiming) &&
	    ktime_get_ns() < READ_ONCE(e->deadline_ns)) {
		s->flags |= GPUSHARE_KMOD_F_RECLAIMING;
		s->deadline_ns = READ_ONCE(e->deadline_ns);
	}
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
		gpushare_entry_unpin(e);
		gpushare_entry_put(e);
	}
	mutex_unlock(&gpushare_map_mutex);
}
