// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare ioctl hooks: ftrace with IP modification on the ioctl system call
 * entries (native and 32-bit compat), and the owner-back wait.
 *
 * The ftrace callback runs for every ioctl on the system, so it only checks,
 * without locks: a watched _IOC_TYPE, a task outside the initial pid
 * namespace, and its namespace present in container_map. Only then does it
 * send the call to gpushare_ioctl*(), which may sleep: device-major check,
 * counters, notice, and the wait for release. Everything else returns to the
 * original at once.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/ftrace.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/pid_namespace.h>
#include <linux/jiffies.h>
#include <linux/ktime.h>
#include <linux/sched/signal.h>

#include "gpushare_internal.h"

bool gpushare_unloading;
static atomic_t gpushare_in_flight = ATOMIC_INIT(0);
static DECLARE_WAIT_QUEUE_HEAD(gpushare_idle_wq);

static u64 gpushare_current_pidns(void)
{
	return task_active_pid_ns(current)->ns.inum;
}

/* ---- the owner-back wait ----------------------------------------------- */

static bool gpushare_reclaim_over(struct gpushare_entry *e, u64 gen)
{
	return READ_ONCE(e->dead) || !READ_ONCE(e->reclaiming) ||
	       READ_ONCE(e->reclaim_gen) != gen || READ_ONCE(gpushare_unloading);
}

/* Ends a reclaim whose deadline has passed; called with e->lock held. */
static bool gpushare_reclaim_expire(struct gpushare_entry *e, u64 gen)
{
	if (!e->reclaiming || e->reclaim_gen != gen ||
	    ktime_get_ns() < e->deadline_ns)
		return false;
	e->reclaiming = false;
	atomic64_inc(&e->timeouts);
	return true;
}

/* Jiffies to sleep until deadline_ns: rounded up, at least one. */
static long gpushare_jiffies_until(u64 deadline_ns, u64 now)
{
	return (long)min_t(u64, nsecs_to_jiffies(deadline_ns - now) + 1,
			   MAX_SCHEDULE_TIMEOUT - 1);
}

/*
 * Until release, the deadline (shared by all waiters, moved later by HOLD:
 * each waiter reads it again when its sleep ends) or a fatal signal.
 */
static void gpushare_wait(struct gpushare_entry *e, u64 gen)
{
	u64 now, deadline;
	bool over;

	for (;;) {
		now = ktime_get_ns();
		deadline = READ_ONCE(e->deadline_ns);
		if (now < deadline &&
		    wait_event_killable_timeout(e->wq,
				gpushare_reclaim_over(e, gen),
				gpushare_jiffies_until(deadline, now)) != 0)
			return;	/* released, or a fatal signal */
		spin_lock(&e->lock);
		over = gpushare_reclaim_expire(e, gen) ||
		       gpushare_reclaim_over(e, gen);
		spin_unlock(&e->lock);
		if (over)
			break;
	}
	wake_up_all(&e->wq);
}

/* Starts a reclaim at this hit; called with e->lock held. */
static void gpushare_reclaim_start(struct gpushare_entry *e, unsigned int cmd,
				   u64 now)
{
	e->reclaiming = true;
	e->reclaim_gen++;
	e->deadline_ns = now + (u64)READ_ONCE(gpushare_timeout_ms) * NSEC_PER_MSEC;
	e->hit = (struct gpushare_kmod_notice) {
		.pidns = e->pidns, .ts_ns = now, .pid = task_tgid_nr(current),
		.tid = task_pid_nr(current), .ioctl_cmd = cmd,
	};
}

/* A watched ioctl in a mapped namespace: count it, maybe notify and wait. */
static void gpushare_hit(struct gpushare_entry *e, unsigned int cmd)
{
	struct gpushare_kmod_notice notice;
	u64 now = ktime_get_ns(), gen;
	bool notify = false, wait;

	atomic64_inc(&e->hits);
	atomic64_set(&e->last_access_ns, now);
	spin_lock(&e->lock);
	/* a reclaim nobody waited out (its owner was killed) ends here */
	gpushare_reclaim_expire(e, e->reclaim_gen);
	/* a DETECT during a reclaim waits for the next hit after it ends */
	if (!e->dead && !e->reclaiming && !READ_ONCE(gpushare_unloading) &&
	    test_and_clear_bit(GPUSHARE_BIT_NEED_NOTICE, &e->flags)) {
		gpushare_reclaim_start(e, cmd, now);
		notice = e->hit;
		notify = true;
	}
	wait = e->reclaiming;
	gen = e->reclaim_gen;
	if (wait)
		atomic_inc(&e->blocked);
	spin_unlock(&e->lock);
	if (notify) {
		atomic64_inc(&e->notices);
		gpushare_notify(&notice);
	}
	if (wait) {
		gpushare_wait(e, gen);
		atomic_dec(&e->blocked);
	}
}

static void gpushare_intercept(unsigned int fd, unsigned int cmd)
{
	struct gpushare_entry *e;

	if (!gpushare_file_watched(fd))
		return;
	e = gpushare_map_get(gpushare_current_pidns());
	if (!e)
		return;
	gpushare_hit(e, cmd);
	gpushare_entry_put(e);
}

static void gpushare_leave(void)
{
	if (atomic_dec_and_test(&gpushare_in_flight) &&
	    READ_ONCE(gpushare_unloading))
		wake_up(&gpushare_idle_wq);
}

/* ---- the hooked functions ------------------------------------------------ */

typedef asmlinkage long (*gpushare_syscall_t)(const struct pt_regs *regs);

static gpushare_syscall_t gpushare_orig_ioctl;
static gpushare_syscall_t gpushare_orig_compat_ioctl;

static asmlinkage long gpushare_ioctl(const struct pt_regs *regs)
{
	long ret;

	gpushare_intercept(regs->di, regs->si);
	ret = gpushare_orig_ioctl(regs);
	gpushare_leave();
	return ret;
}

static asmlinkage long gpushare_compat_ioctl(const struct pt_regs *regs)
{
	long ret;

	gpushare_intercept(regs->bx, regs->cx);
	ret = gpushare_orig_compat_ioctl(regs);
	gpushare_leave();
	return ret;
}

struct gpushare_hook {
	const char *name;
	void *wrapper;
	gpushare_syscall_t *orig;
	ftrace_func_t thunk;
	bool optional;
	unsigned long address;
	struct ftrace_ops ops;
	bool installed;
};

static void notrace gpushare_thunk_native(unsigned long ip,
					  unsigned long parent_ip,
					  struct ftrace_ops *ops,
					  GPUSHARE_FTRACE_REGS *fregs);
static void notrace gpushare_thunk_compat(unsigned long ip,
					  unsigned long parent_ip,
					  struct ftrace_ops *ops,
					  GPUSHARE_FTRACE_REGS *fregs);

/* The hooks: native first, then compat (the thunks index this table). */
static struct gpushare_hook gpushare_hooks[] = {
	{ .name = "__x64_sys_ioctl", .wrapper = gpushare_ioctl,
	  .orig = &gpushare_orig_ioctl, .thunk = gpushare_thunk_native },
	{ .name = "__ia32_compat_sys_ioctl", .wrapper = gpushare_compat_ioctl,
	  .orig = &gpushare_orig_compat_ioctl,
	  .thunk = gpushare_thunk_compat,
	  .optional = !IS_ENABLED(CONFIG_IA32_EMULATION) },
};

/*
 * Runs for every ioctl on the system, so the cheapest tests come first and
 * take no lock: one bit for the ioctl type, then the pid namespace's level
 * (0 = the initial one). Only a candidate reaches the map lookup and is sent
 * to the sleepable wrapper.
 */
static __always_inline void gpushare_thunk(GPUSHARE_FTRACE_REGS *fregs,
					   unsigned long parent_ip,
					   struct gpushare_hook *hook,
					   bool compat)
{
	struct pt_regs *regs = gpushare_ftrace_regs(fregs);
	const struct pt_regs *uregs = (const struct pt_regs *)regs->di;
	struct pid *pid;

	if (likely(!gpushare_type_watched(compat ? uregs->cx : uregs->si)))
		return;
	pid = task_pid(current);
	if (!pid->level || within_module(parent_ip, THIS_MODULE) ||
	    READ_ONCE(gpushare_unloading))
		return;
	if (!gpushare_map_contains(ns_of_pid(pid)->ns.inum))
		return;
	atomic_inc(&gpushare_in_flight);
	regs->ip = (unsigned long)hook->wrapper;
}

static void notrace gpushare_thunk_native(unsigned long ip,
					  unsigned long parent_ip,
					  struct ftrace_ops *ops,
					  GPUSHARE_FTRACE_REGS *fregs)
{
	gpushare_thunk(fregs, parent_ip, &gpushare_hooks[0], false);
}

static void notrace gpushare_thunk_compat(unsigned long ip,
					  unsigned long parent_ip,
					  struct ftrace_ops *ops,
					  GPUSHARE_FTRACE_REGS *fregs)
{
	gpushare_thunk(fregs, parent_ip, &gpushare_hooks[1], true);
}

/* ---- install / remove ------------------------------------------------------ */

/* Symbol address through a kprobe: the documented way since 5.7. */
static unsigned long gpushare_lookup_name(const char *name)
{
	struct kprobe kp = { .symbol_name = name };
	unsigned long addr;

	if (register_kprobe(&kp) < 0)
		return 0;
	addr = (unsigned long)kp.addr;
	unregister_kprobe(&kp);
#ifdef CONFIG_X86_KERNEL_IBT
	/* kprobes skip the ENDBR; callers need the real entry. */
	if (addr && *(u32 *)(addr - 4) == 0xfa1e0ff3)
		addr -= 4;
#endif
	return addr;
}

static int gpushare_hook_install(struct gpushare_hook *hook)
{
	int ret;

	hook->address = gpushare_lookup_name(hook->name);
	if (!hook->address)
		return hook->optional ? 0 : -ENOENT;
	*hook->orig = (gpushare_syscall_t)hook->address;
	hook->ops.func = hook->thunk;
	hook->ops.flags = GPUSHARE_FTRACE_FLAGS;
	ret = ftrace_set_filter_ip(&hook->ops, hook->address, 0, 0);
	if (ret)
		goto err_filter;
	ret = register_ftrace_function(&hook->ops);
	if (ret)
		goto err_register;
	hook->installed = true;
	return 0;

err_register:
	ftrace_set_filter_ip(&hook->ops, hook->address, 1, 0);
err_filter:
	pr_err("cannot hook %s: %d\n", hook->name, ret);
	return ret;
}

static void gpushare_hook_remove(struct gpushare_hook *hook)
{
	if (!hook->installed)
		return;
	unregister_ftrace_function(&hook->ops);
	ftrace_set_filter_ip(&hook->ops, hook->address, 1, 0);
	hook->installed = false;
}

static void gpushare_hooks_remove(int n)
{
	while (n-- > 0)
		gpushare_hook_remove(&gpushare_hooks[n]);
}

int gpushare_hooks_init(void)
{
	int i, ret;

	WRITE_ONCE(gpushare_unloading, false);
	for (i = 0; i < ARRAY_SIZE(gpushare_hooks); i++) {
		ret = gpushare_hook_install(&gpushare_hooks[i]);
		if (ret)
			goto err_install;
	}
	return 0;

err_install:
	gpushare_hooks_remove(i);
	return ret;
}

/* Stop new hooks, wake every waiter, wait for hooks in flight to leave. */
void gpushare_hooks_exit(void)
{
	WRITE_ONCE(gpushare_unloading, true);
	gpushare_hooks_remove(ARRAY_SIZE(gpushare_hooks));
	gpushare_map_wake_all();
	wait_event(gpushare_idle_wq, atomic_read(&gpushare_in_flight) == 0);
	/* A task may still run the last instructions of a wrapper. */
	synchronize_rcu_tasks();
}
