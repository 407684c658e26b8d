// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl checks, part two: timeout, dead receiver, fatal signal
 * and run-time configuration. One "RESULT <name> key=value ..." line each.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "kmodctl.h"

static int write_timeout(unsigned int ms)
{
	char value[16];

	snprintf(value, sizeof(value), "%u\n", ms);
	return write_param("timeout_ms", value);
}

void check_timeout(unsigned int ms)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	struct owner o;
	int set, got_notice, got;

	set = write_timeout(ms);
	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	got = owner_result(&o, &r, 10000);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	printf("RESULT timeout set=%d timeout_ms=%u notice=%d got=%d err=%d"
	       " blocked_ms=%llu timeouts=%llu releases=%llu flags=%u\n",
	       set, ms, got_notice, got, r.err,
	       (unsigned long long)(r.end_ns - r.start_ns) / 1000000,
	       (unsigned long long)s.timeouts, (unsigned long long)s.releases,
	       s.flags);
	write_timeout(3000);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

void check_fatal(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner o;
	int got_notice;
	uint64_t t;

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	wait_blocked(o.pidns, 1);
	t = now_ns();
	kill(o.pid, SIGKILL);
	waitpid(o.pid, NULL, 0);
	printf("RESULT fatal notice=%d reaped_ms=%llu", got_notice,
	       (unsigned long long)us_since(t) / 1000);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	printf(" blocked_after=%u\n", s.blocked);
	close(o.go_w);
	close(o.res_r);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

void check_config(void)
{
	struct gpushare_kmod_config cfg = {}, now = {};
	struct gpushare_kmod_notice n = {};
	struct owner_result r = {};
	int get, set1, set2, notice1, notice2, bad;
	struct owner o;

	get = nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_CONFIG, 0, NULL, 0, &check_rep);
	memcpy(&now, check_rep.items, sizeof(now));
	cfg = now;
	cfg.nmajors = 1;
	cfg.majors[0] = 1;	/* /dev/null is char 1:3 */
	set1 = nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &check_rep);
	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	notice1 = recv_notice(&n);
	cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	owner_result(&o, &r, ARRIVE_MS);
	cfg.majors[0] = 195;	/* a GPU's major, not /dev/null's */
	set2 = nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &check_rep);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	owner_result(&o, &r, ARRIVE_MS);
	notice2 = nl_pending(check_rcv);
	cfg.nmajors = 99;
	bad = nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &check_rep);
	nl_cmd_payload(check_ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &now, sizeof(now), &check_rep);
	printf("RESULT config get=%d ntypes=%u type0=%u nmajors=%u set_major1=%d"
	       " notice_major1=%d set_major195=%d notice_major195=%d bad=%d\n",
	       get, now.ntypes, now.types[0], now.nmajors, set1, notice1, set2,
	       notice2, bad);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}


/* The receiver is gone: the notice is dropped, the owner waits the timeout. */
void check_dead_receiver(int unit, unsigned int ms)
{
	struct gpushare_kmod_stats_head h0 = {}, h1 = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int dead = nl_open(unit), reg, got;
	struct owner o;

	reg = nl_cmd(dead, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &check_rep);
	close(dead);
	write_timeout(ms);
	owner_start(&o);
	nl_stats_one(check_ctl, o.pidns, &s, &h0);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	got = owner_result(&o, &r, 10000);
	nl_stats_one(check_ctl, o.pidns, &s, &h1);
	printf("RESULT deadrcv register=%d got=%d err=%d timeout_ms=%u blocked_ms=%llu"
	       " dropped=%llu sent=%llu timeouts=%llu\n", reg, got, r.err, ms,
	       (unsigned long long)(r.end_ns - r.start_ns) / 1000000,
	       (unsigned long long)(h1.notices_dropped - h0.notices_dropped),
	       (unsigned long long)(h1.notices_sent - h0.notices_sent),
	       (unsigned long long)s.timeouts);
	write_timeout(3000);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

/*
 * DETECT during a reclaim: the blocked owner stays blocked on the same
 * release, and the next hit after it sends the next notice. Then DELETE of
 * a reclaiming namespace wakes its owner.
 */
void check_redetect_and_delete(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int notice1, redetect, rel, got1, pending, notice2, del, got2;
	unsigned int flags;
	struct owner o;

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 1);
	notice1 = recv_notice(&n);
	redetect = at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	flags = s.flags;
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	got1 = owner_result(&o, &r, ARRIVE_MS);
	pending = nl_pending(check_rcv);
	owner_go(&o, TYPE_NV, 1);
	notice2 = recv_notice(&n);
	wait_blocked(o.pidns, 1);
	del = cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
	got2 = owner_result(&o, &r, ARRIVE_MS);
	printf("RESULT redetect notice1=%d redetect=%d flags=%u release=%d got1=%d"
	       " pending=%d notice2=%d delete=%d got2=%d err=%d delete_wake_ms=%llu\n",
	       notice1, redetect, flags, rel, got1, pending, notice2, del, got2,
	       r.err, (unsigned long long)(r.end_ns - r.start_ns) / 1000000);
	owner_stop(&o);
}

static int exited_within(pid_t pid, int ms, int *status)
{
	uint64_t t = now_ns();

	do {
		if (waitpid(pid, status, WNOHANG) == pid)
			return 1;
		usleep(5000);
	} while (now_ns() - t < (uint64_t)ms * 1000000);
	return 0;
}

/* A 32-bit program (prog) in a new pid namespace: the compat hook. */
void check_compat(const char *prog)
{
	struct gpushare_kmod_notice n = {};
	int go[2], got_notice, held, rel, status = -1, done;
	uint64_t pidns, t;
	pid_t pid;
	char c = 1;

	if (pipe(go) < 0)
		return;
	pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid == 0) {
		if (read(go[0], &c, 1) == 1)
			execl(prog, prog, (char *)NULL);
		_exit(127);
	}
	close(go[0]);
	pidns = pidns_of(pid);
	target1(GPUSHARE_KMOD_CMD_DETECT, pidns, pid);
	if (write(go[1], &c, 1) != 1)
		return;
	got_notice = recv_notice(&n);
	held = !exited_within(pid, 400, &status);
	t = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, pidns);
	done = held ? exited_within(pid, ARRIVE_MS, &status) : 1;
	printf("RESULT compat notice=%d pid_ok=%d cmd=%u held=%d release=%d done=%d"
	       " exit=%d unblock_ms=%llu\n", got_notice, n.pid == (uint32_t)pid,
	       n.ioctl_cmd, held, rel, done,
	       WIFEXITED(status) ? WEXITSTATUS(status) : -1,
	       (unsigned long long)us_since(t) / 1000);
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	close(go[1]);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, pidns);
}

/*
 * Churn: an owner loops over watched ioctls while the namespace is added,
 * put in detect mode, released and deleted over and over; the module must
 * neither crash nor leave the owner blocked past the loop.
 */
void check_churn(long calls)
{
	uint64_t ids[1], t = now_ns();
	int status = -1, cycles = 0, done;
	pid_t pid;

	pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid == 0)
		_exit(ioctl_loop(TYPE_NV, calls) == calls ? 0 : 1);
	ids[0] = pidns_of(pid);
	do {
		target1(GPUSHARE_KMOD_CMD_ADD, ids[0], pid);
		target1(GPUSHARE_KMOD_CMD_DETECT, ids[0], pid);
		cmd1(GPUSHARE_KMOD_CMD_RELEASE, ids[0]);
		cmd1(GPUSHARE_KMOD_CMD_DELETE, ids[0]);
		cycles++;
		done = waitpid(pid, &status, WNOHANG) == pid;
	} while (!done && now_ns() - t < 20000000000ull);
	if (!done) {
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
	}
	while (nl_pending(check_rcv))
		recv(check_rcv, &check_rep, sizeof(check_rep), 0);
	printf("RESULT churn calls=%ld cycles=%d done=%d exit=%d ms=%llu\n", calls,
	       cycles, done, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
	       (unsigned long long)us_since(t) / 1000);
}
