// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl checks: each prints one "RESULT <name> key=value ..."
 * line with raw measurements; the test suite asserts on them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <linux/netlink.h>

#include "kmodctl.h"

#define HOLD_MS 400

struct kmodctl_reply check_rep;
int check_ctl = -1, check_rcv = -1;

uint64_t us_since(uint64_t t)
{
	return (now_ns() - t) / 1000;
}

int cmd1(uint16_t cmd, uint64_t id)
{
	return nl_cmd(check_ctl, cmd, &id, 1, &check_rep);
}

int target1(uint16_t cmd, uint64_t pidns, pid_t pid)
{
	return nl_target(check_ctl, cmd, pidns, pid, &check_rep);
}

int at1(uint16_t cmd, const struct owner *o)
{
	return target1(cmd, o->pidns, o->pid);
}

/* Waits for the owner's blocked count to reach want; returns it. */
unsigned int wait_blocked(uint64_t pidns, unsigned int want)
{
	struct gpushare_kmod_stats s = {};
	uint64_t t = now_ns();

	while (nl_stats_one(check_ctl, pidns, &s, NULL) == 1 && s.blocked < want &&
	       now_ns() - t < ARRIVE_MS * 1000000ull)
		usleep(5000);
	return s.blocked;
}

int recv_notice(struct gpushare_kmod_notice *n)
{
	static struct kmodctl_reply r;
	int ret = nl_recv(check_rcv, &r, ARRIVE_MS);

	if (ret <= 0 || r.nl_type != GPUSHARE_KMOD_MSG_NOTICE ||
	    r.hdr.cmd != GPUSHARE_KMOD_CMD_NOTICE || r.hdr.count != 1 ||
	    r.items_len != sizeof(*n))
		return 0;
	memcpy(n, r.items, sizeof(*n));
	return 1;
}

static void check_nodetect(void)
{
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	struct owner o;
	int add, got;

	owner_start(&o);
	add = at1(GPUSHARE_KMOD_CMD_ADD, &o);
	owner_go(&o, TYPE_NV, 1);
	got = owner_result(&o, &r, ARRIVE_MS);
	printf("RESULT nodetect add=%d got=%d ret=%d err=%d elapsed_us=%llu notice_pending=%d",
	       add, got, r.ret, r.err,
	       (unsigned long long)(r.end_ns - r.start_ns) / 1000, nl_pending(check_rcv));
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	printf(" hits=%llu notices=%llu flags=%u\n", (unsigned long long)s.hits,
	       (unsigned long long)s.notices, s.flags);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

static void check_detect(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats_head h = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {}, r2 = {};
	uint64_t t0, trel;
	struct owner o;
	int det, got_notice, held, rel, got, got2, extra;

	owner_start(&o);
	det = at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	t0 = now_ns();
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	held = !owner_result(&o, &r, HOLD_MS);
	trel = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	got = owner_result(&o, &r, ARRIVE_MS);
	owner_go(&o, TYPE_NV, 1);
	got2 = owner_result(&o, &r2, ARRIVE_MS);
	extra = nl_pending(check_rcv);
	nl_stats_one(check_ctl, o.pidns, &s, &h);
	printf("RESULT detect detect=%d notice=%d notice_pidns=%llu want_pidns=%llu"
	       " notice_pid=%u want_pid=%d notice_cmd=%u want_cmd=%u"
	       " notice_ts=%llu t0=%llu held=%d release=%d got=%d ret=%d err=%d"
	       " unblock_us=%lld blocked_us=%llu",
	       det, got_notice, (unsigned long long)n.pidns,
	       (unsigned long long)o.pidns, n.pid, (int)o.pid, n.ioctl_cmd,
	       (unsigned int)_IO(TYPE_NV, 1), (unsigned long long)n.ts_ns,
	       (unsigned long long)t0, held, rel, got, r.ret, r.err,
	       (long long)(r.end_ns - trel) / 1000,
	       (unsigned long long)(r.end_ns - r.start_ns) / 1000);
	printf(" again_got=%d again_us=%llu extra_notice=%d hits=%llu notices=%llu"
	       " releases=%llu timeouts=%llu blocked=%u flags=%u last_access=%llu"
	       " again_start=%llu again_end=%llu now=%llu\n",
	       got2, (unsigned long long)(r2.end_ns - r2.start_ns) / 1000, extra,
	       (unsigned long long)s.hits, (unsigned long long)s.notices,
	       (unsigned long long)s.releases, (unsigned long long)s.timeouts,
	       s.blocked, s.flags, (unsigned long long)s.last_access_ns,
	       (unsigned long long)r2.start_ns, (unsigned long long)r2.end_ns,
	       (unsigned long long)h.now_ns);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

static void check_filter(void)
{
	uint64_t self = pidns_of(getpid()), t;
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	unsigned long long init_us;
	struct owner o;
	int det_init, got, flags_after;

	det_init = target1(GPUSHARE_KMOD_CMD_DETECT, self, getpid());
	t = now_ns();
	ioctl_loop(TYPE_NV, 1);
	init_us = us_since(t);
	printf("RESULT initns detect=%d elapsed_us=%llu notice_pending=%d\n",
	       det_init, init_us, nl_pending(check_rcv));
	cmd1(GPUSHARE_KMOD_CMD_DELETE, self);

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_OTHER, 1);
	got = owner_result(&o, &r, ARRIVE_MS);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	cmd1(GPUSHARE_KMOD_CMD_UNDETECT, o.pidns);
	flags_after = 0;
	{
		struct gpushare_kmod_stats s2 = {};

		nl_stats_one(check_ctl, o.pidns, &s2, NULL);
		flags_after = s2.flags;
	}
	printf("RESULT othertype got=%d err=%d elapsed_us=%llu notice_pending=%d"
	       " hits=%llu flags=%u flags_after_undetect=%d\n",
	       got, r.err, (unsigned long long)(r.end_ns - r.start_ns) / 1000,
	       nl_pending(check_rcv), (unsigned long long)s.hits, s.flags, flags_after);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

static void check_threads(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r[2] = {};
	struct owner o;
	int got_notice, rel, got = 0, extra, i;
	unsigned int blocked;
	uint64_t trel;

	owner_start(&o);
	at1(GPUSHARE_KMOD_CMD_DETECT, &o);
	owner_go(&o, TYPE_NV, 2);
	got_notice = recv_notice(&n);
	blocked = wait_blocked(o.pidns, 2);
	extra = nl_pending(check_rcv);
	trel = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	for (i = 0; i < 2; i++)
		got += owner_result(&o, &r[i], ARRIVE_MS);
	nl_stats_one(check_ctl, o.pidns, &s, NULL);
	printf("RESULT threads notice=%d blocked=%u extra_notice=%d release=%d"
	       " got=%d unblock0_us=%lld unblock1_us=%lld notices=%llu hits=%llu\n",
	       got_notice, blocked, extra, rel, got,
	       (long long)(r[0].end_ns - trel) / 1000,
	       (long long)(r[1].end_ns - trel) / 1000,
	       (unsigned long long)s.notices, (unsigned long long)s.hits);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

int run_checks(int unit, const char *compat_prog)
{
	check_ctl = nl_open(unit);
	check_rcv = nl_open(unit);
	if (check_ctl < 0 || check_rcv < 0) {
		printf("RESULT open check_ctl=%d check_rcv=%d\n", check_ctl, check_rcv);
		return 1;
	}
	printf("RESULT register status=%d\n",
	       nl_cmd(check_rcv, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &check_rep));
	check_nodetect();
	check_targets();
	check_pin();
	check_detect();
	check_filter();
	check_threads();
	check_fatal();
	check_config();
	check_redetect_and_delete();
	check_churn(100000);
	if (compat_prog)
		check_compat(compat_prog);
	check_timeout(700);
	check_hold();
	check_resend(unit);
	check_params();
	refused_checks(check_ctl, unit, &check_rep);
	check_dead_receiver(unit, 700);
	fflush(stdout);
	close(check_ctl);
	close(check_rcv);
	return 0;
}
