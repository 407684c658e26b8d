// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl: unload while blocked, and the benchmarks (ioctl loop
 * cost, release -> unblock latency).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>

#include "kmodctl.h"

static struct kmodctl_reply bench_rep;

static int bench_notice(int rcv, struct gpushare_kmod_notice *n)
{
	static struct kmodctl_reply r;

	if (nl_recv(rcv, &r, 5000) <= 0 || r.nl_type != GPUSHARE_KMOD_MSG_NOTICE)
		return 0;
	memcpy(n, r.items, sizeof(*n));
	return 1;
}

static int open_pair(int unit, int *ctl, int *rcv)
{
	*ctl = nl_open(unit);
	*rcv = nl_open(unit);
	if (*ctl < 0 || *rcv < 0)
		return -1;
	return nl_cmd(*rcv, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &bench_rep);
}

int run_unload_check(int unit, const char *module)
{
	struct gpushare_kmod_notice n = {};
	struct owner_result r = {};
	int ctl, rcv, got_notice, rc, got;
	struct owner o;
	uint64_t t, t_done;

	if (open_pair(unit, &ctl, &rcv))
		return 1;
	owner_start(&o);
	nl_target(ctl, GPUSHARE_KMOD_CMD_DETECT, o.pidns, o.pid, &bench_rep);
	owner_go(&o, 0x46, 1);
	got_notice = bench_notice(rcv, &n);
	/* user sockets of the protocol pin the module: close them first */
	close(ctl);
	close(rcv);
	t = now_ns();
	rc = syscall(SYS_delete_module, module, O_NONBLOCK);
	if (rc < 0)
		rc = -errno;
	t_done = now_ns();
	got = owner_result(&o, &r, 10000);
	printf("RESULT unload notice=%d rc=%d rmmod_ms=%llu got=%d err=%d"
	       " resumed_after_ms=%lld\n",
	       got_notice, rc, (unsigned long long)(t_done - t) / 1000000, got,
	       r.err, (long long)((long long)r.end_ns - (long long)t) / 1000000);
	owner_stop(&o);
	return 0;
}

static long tty_loop_any(unsigned int type, long n)
{
	(void)type;
	return tty_loop(n);
}

/*
 * ns per ioctl in a new pid namespace (in container_map or not): type on
 * /dev/null, or type 0 for TCGETS on a pseudo-terminal.
 */
int run_bench_loop(unsigned int type, long n, int in_map, int unit)
{
	int ctl = -1, go[2], res[2];
	uint64_t pidns, ns = 0;
	char c = 1;
	pid_t pid;

	if (pipe(go) < 0 || pipe(res) < 0)
		return 1;
	pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid == 0) {
		long (*loop)(unsigned int, long) = type ? ioctl_loop : tty_loop_any;
		uint64_t t;

		if (read(go[0], &c, 1) != 1)
			_exit(1);
		loop(type, n / 10);	/* warm up */
		t = now_ns();
		loop(type, n);
		t = now_ns() - t;
		_exit(write(res[1], &t, sizeof(t)) == sizeof(t) ? 0 : 1);
	}
	pidns = pidns_of(pid);
	if (in_map) {
		ctl = nl_open(unit);
		nl_target(ctl, GPUSHARE_KMOD_CMD_ADD, pidns, pid, &bench_rep);
	}
	if (write(go[1], &c, 1) != 1 || read(res[0], &ns, sizeof(ns)) != sizeof(ns))
		return 1;
	if (ctl >= 0) {
		nl_cmd(ctl, GPUSHARE_KMOD_CMD_DELETE, &pidns, 1, &bench_rep);
		close(ctl);
	}
	printf("RESULT loop type=%u n=%ld in_map=%d ns_per_call=%.1f\n", type, n,
	       in_map, (double)ns / n);
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t pct(const uint64_t *v, int n, int p)
{
	int i = (n * p + 99) / 100 - 1;

	return v[i < 0 ? 0 : (i >= n ? n - 1 : i)];
}

int run_bench_release(int unit, int rounds)
{
	uint64_t *lat = calloc(rounds, sizeof(*lat));
	uint64_t *note = calloc(rounds, sizeof(*note));
	struct gpushare_kmod_notice n;
	struct owner_result r;
	int ctl, rcv, i, ok = 0;
	struct owner o;
	uint64_t t;

	if (!lat || !note || open_pair(unit, &ctl, &rcv))
		return 1;
	owner_start(&o);
	for (i = 0; i < rounds; i++) {
		nl_target(ctl, GPUSHARE_KMOD_CMD_DETECT, o.pidns, o.pid, &bench_rep);
		owner_go(&o, 0x46, 1);
		if (!bench_notice(rcv, &n))
			break;
		note[ok] = now_ns() - n.ts_ns;
		t = now_ns();
		nl_cmd(ctl, GPUSHARE_KMOD_CMD_RELEASE, &o.pidns, 1, &bench_rep);
		if (!owner_result(&o, &r, 5000))
			break;
		lat[ok++] = r.end_ns - t;
	}
	qsort(lat, ok, sizeof(*lat), cmp_u64);
	qsort(note, ok, sizeof(*note), cmp_u64);
	printf("RESULT release rounds=%d p50_us=%.1f p99_us=%.1f max_us=%.1f"
	       " notice_p50_us=%.1f notice_p99_us=%.1f\n", ok,
	       pct(lat, ok, 50) / 1e3, pct(lat, ok, 99) / 1e3,
	       ok ? lat[ok - 1] / 1e3 : 0.0, pct(note, ok, 50) / 1e3,
	       pct(note, ok, 99) / 1e3);
	nl_cmd(ctl, GPUSHARE_KMOD_CMD_DELETE, &o.pidns, 1, &bench_rep);
	owner_stop(&o);
	free(lat);
	free(note);
	return ok == rounds ? 0 : 1;
}
