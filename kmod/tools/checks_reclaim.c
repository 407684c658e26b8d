// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl checks, part three: targets checked against the process
 * they name, namespaces pinned while watched, HOLD, notices sent again on
 * REGISTER, and parameters validated when written. One "RESULT <name>
 * key=value ..." line each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "kmodctl.h"

#define PROBES 256
#define PARAMS "/sys/module/gpushare/parameters/"

int write_param(const char *name, const char *value)
{
	char path[128];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), PARAMS "%s", name);
	fd = open(path, O_WRONLY);
	if (fd < 0)
		return -errno;
	n = write(fd, value, strlen(value));
	n = n < 0 ? -errno : 0;
	close(fd);
	return (int)n;
}

unsigned long read_param(const char *name)
{
	char path[128], buf[32] = "";
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), PARAMS "%s", name);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtoul(buf, NULL, 10) : 0;
}

/* A child alone in a new pid namespace, waiting to be killed. */
static pid_t ns_child(uint64_t *inum)
{
	pid_t pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);

	if (pid == 0) {
		pause();
		_exit(0);
	}
	*inum = pid > 0 ? pidns_of(pid) : 0;
	return pid;
}

static void reap(pid_t pid)
{
	if (pid <= 0)
		return;
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/*
 * New namespaces until one gets id a or b (returned; 0 after 10 s). The
 * kernel gives out the lowest free id: a probe that gets a lower one fills a
 * hole and is kept alive, so the next probe looks higher; one that gets a
 * fresh id above both means nothing wanted is free yet (a namespace's id is
 * freed an RCU grace period after its last process is reaped): it is let go
 * and the next probe comes a little later.
 */
static uint64_t probe_until(uint64_t a, uint64_t b, pid_t *kept, int *nkept)
{
	uint64_t inum, top = a > b ? a : b, t = now_ns();
	pid_t pid;

	while (*nkept < PROBES && now_ns() - t < 10000000000ull) {
		pid = ns_child(&inum);
		if (inum && (inum == a || inum == b || inum < top)) {
			kept[(*nkept)++] = pid;
			if (inum == a || inum == b)
				return inum;
			continue;
		}
		reap(pid);
		usleep(2000);
	}
	return 0;
}

/*
 * Owner A's namespace is added, then a control namespace Z is made (above A:
 * a lower hole freed meanwhile is filled first); both die. The kernel gives out the lowest free id, A's is lower than Z's, and
 * A's died first: a new namespace gets Z's id while A's stays pinned by
 * the entry, and A's once DELETE dropped the reference.
 */
void check_pin(void)
{
	static pid_t kept[PROBES];
	uint64_t a_id, z_id, pinned, freed;
	int add, del, nkept = 0, first, i;
	struct owner a;
	pid_t z;

	owner_start(&a);
	a_id = a.pidns;
	add = at1(GPUSHARE_KMOD_CMD_ADD, &a);
	z = ns_child(&z_id);
	while (z > 0 && z_id && z_id < a_id && nkept < PROBES) {
		/* an id below A's freed late (an earlier check's namespace, an RCU grace period
		 * after its reaping): keep it filled and make Z again, above A */
		kept[nkept++] = z;
		z = ns_child(&z_id);
	}
	owner_stop(&a);
	reap(z);
	pinned = probe_until(a_id, z_id, kept, &nkept);
	first = nkept;
	del = cmd1(GPUSHARE_KMOD_CMD_DELETE, a_id);
	freed = probe_until(a_id, a_id, kept, &nkept);
	printf("RESULT pin add=%d a_below_z=%d z_reused=%d a_reused_while_pinned=%d"
	       " probes=%d delete=%d a_reused_after_delete=%d probes_after=%d\n",
	       add, a_id < z_id, pinned == z_id, pinned == a_id, first, del,
	       freed == a_id, nkept - first);
	for (i = 0; i < nkept; i++)
		reap(kept[i]);
}

/* Per-target statuses: -ESRCH, -ESTALE, and a mixed message. */
void check_targets(void)
{
	struct gpushare_kmod_target t[2];
	struct gpushare_kmod_stats s;
	struct owner a, b;
	int32_t st[2] = { 1, 1 };
	int esrch, estale, mixed, a_in, b_in;
	pid_t dead = fork();

	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	owner_start(&a);
	owner_start(&b);
	esrch = target1(GPUSHARE_KMOD_CMD_ADD, a.pidns, dead);
	estale = target1(GPUSHARE_KMOD_CMD_DETECT, b.pidns, a.pid);
	t[0] = (struct gpushare_kmod_target) { .pidns = a.pidns, .pid = a.pid };
	t[1] = (struct gpushare_kmod_target) { .pidns = b.pidns, .pid = a.pid };
	mixed = nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_ADD, 2, t, sizeof(t),
			       &check_rep);
	if (check_rep.hdr.count == 2 && check_rep.items_len == sizeof(st))
		memcpy(st, check_rep.items, sizeof(st));
	a_in = nl_stats_one(check_ctl, a.pidns, &s, NULL);
	b_in = nl_stats_one(check_ctl, b.pidns, &s, NULL);
	printf("RESULT targets esrch=%d estale=%d mixed=%d count=%u status0=%d"
	       " status1=%d a_in=%d b_in=%d\n", esrch, estale, mixed,
	       check_rep.hdr.count, st[0], st[1], a_in, b_in);
	owner_stop(&a);
	owner_stop(&b);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, a.pidns);
}

/* HOLD every 250 ms keeps the owner blocked past the timeout (1 s). */
static void hold_extends(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int got_notice, moved = 0, held, rel, got, i;
	struct owner o;
	uint64_t t;

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	for (i = 0; i < 10; i++) {
		usleep(250000);
		moved += cmd1(GPUSHARE_KMOD_CMD_HOLD, o.pidns) == 1;
	}
	held = !owner_result(&o, &r, 0);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	t = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	got = owner_result(&o, &r, ARRIVE_MS);
	printf("RESULT hold notice=%d moved=%d held=%d held_ms=%llu holds=%llu"
	       " deadline_ahead_ms=%lld flags=%u release=%d got=%d unblock_ms=%llu"
	       " timeouts=%llu", got_notice, moved, held,
	       (unsigned long long)(t - n.ts_ns) / 1000000,
	       (unsigned long long)s.holds,
	       ((long long)s.deadline_ns - (long long)t) / 1000000, s.flags, rel,
	       got, (unsigned long long)(r.end_ns - t) / 1000000,
	       (unsigned long long)s.timeouts);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

/* HOLD forever: the owner resumes at hit + max_hold_ms (3 s). */
static void hold_capped(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int got_notice, moved = 0, got = 0, after, idle;
	struct owner o;

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	while (!got && now_ns() - n.ts_ns < 10000000000ull) {
		got = owner_result(&o, &r, 250);
		if (!got)
			moved += cmd1(GPUSHARE_KMOD_CMD_HOLD, o.pidns) == 1;
	}
	after = cmd1(GPUSHARE_KMOD_CMD_HOLD, o.pidns);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	idle = cmd1(GPUSHARE_KMOD_CMD_HOLD, o.pidns);
	printf(" cap_notice=%d cap_moved=%d cap_got=%d cap_blocked_ms=%llu"
	       " cap_after=%d cap_timeouts=%llu cap_releases=%llu cap_flags=%u"
	       " idle=%d\n", got_notice, moved, got,
	       (unsigned long long)(r.end_ns - n.ts_ns) / 1000000, after,
	       (unsigned long long)s.timeouts, (unsigned long long)s.releases,
	       s.flags, idle);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

void check_hold(void)
{
	write_param("timeout_ms", "1000");
	hold_extends();
	write_param("max_hold_ms", "3000");
	hold_capped();
	write_param("timeout_ms", "3000");
	write_param("max_hold_ms", "30000");
}

/*
 * The receiver is gone at the hit: the notice is dropped. A new receiver
 * registers and gets it, with the hit's pidns, pid and time; registering
 * again sends the same notice again; after RELEASE, nothing.
 */
void check_resend(int unit)
{
	struct gpushare_kmod_stats_head h0 = {}, h1 = {};
	struct gpushare_kmod_notice n = {}, again = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int dead = nl_open(unit), fresh = nl_open(unit);
	int reg, got_fresh, got_again, held, rel, got, after;
	static struct kmodctl_reply rep;
	struct owner o;
	uint64_t t0;

	nl_cmd(dead, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &rep);
	close(dead);
	owner_start(&o);
	nl_stats_one(check_ctl, o.pidns, &s, &h0);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	t0 = now_ns();
	owner_go(&o, TYPE_NV, 1);
	wait_blocked(o.pidns, 1);
	nl_stats_one(check_ctl, o.pidns, &s, &h1);
	reg = nl_cmd(fresh, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &rep);
	got_fresh = nl_recv(fresh, &rep, ARRIVE_MS) == 1 &&
		    rep.nl_type == GPUSHARE_KMOD_MSG_NOTICE &&
		    rep.items_len == sizeof(n);
	memcpy(&n, rep.items, sizeof(n));
	nl_cmd(check_rcv, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &check_rep);
	got_again = recv_notice(&again);
	held = !owner_result(&o, &r, 0);
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	got = owner_result(&o, &r, ARRIVE_MS);
	nl_cmd(check_rcv, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &check_rep);
	after = nl_recv(check_rcv, &rep, 300);
	printf("RESULT resend dropped=%llu register=%d notice=%d pidns_ok=%d"
	       " pid_ok=%d ts_ok=%d flags=%u again=%d same_ts=%d again_flags=%u"
	       " held=%d release=%d got=%d after_release=%d\n",
	       (unsigned long long)(h1.notices_dropped - h0.notices_dropped), reg,
	       got_fresh, n.pidns == o.pidns, n.pid == (uint32_t)o.pid,
	       t0 <= n.ts_ns && n.ts_ns <= now_ns(), n.flags, got_again,
	       again.ts_ns == n.ts_ns && again.pidns == n.pidns, again.flags, held,
	       rel, got, after);
	close(fresh);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

/* Bad values written at run time are refused and the old value stays. */
void check_params(void)
{
	static const char *const bad[] = { "0\n", "600001\n", "abc\n", "-5\n", "\n" };
	const char *names[] = { "timeout_ms", "max_hold_ms" };
	int refused[2] = {}, good[2], i, j;
	unsigned long kept[2], now[2];

	for (i = 0; i < 2; i++) {
		kept[i] = read_param(names[i]);
		for (j = 0; j < 5; j++)
			refused[i] += write_param(names[i], bad[j]) == -EINVAL;
		now[i] = read_param(names[i]);
		good[i] = write_param(names[i], "2500\n");
	}
	printf("RESULT params timeout_before=%lu timeout_refused=%d timeout_after=%lu"
	       " timeout_good=%d timeout_set=%lu hold_before=%lu hold_refused=%d"
	       " hold_after=%lu hold_good=%d hold_set=%lu\n", kept[0], refused[0],
	       now[0], good[0], read_param(names[0]), kept[1], refused[1], now[1],
	       good[1], read_param(names[1]));
	write_param("timeout_ms", "3000");
	write_param("max_hold_ms", "30000");
}
