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
#define TYPE_NV 0x46
#define TYPE_OTHER 0x47

static struct kmodctl_reply rep;
static int ctl = -1, rcv = -1;

static uint64_t us_since(uint64_t t) { return (now_ns() - t) / 1000; }

static int cmd1(uint16_t cmd, uint64_t id)
{
	return nl_cmd(ctl, cmd, &id, 1, &rep);
}

/* Waits for the owner's blocked count to reach want; returns it. */
static unsigned int wait_blocked(uint64_t pidns, unsigned int want)
{
	struct gpushare_kmod_stats s = {};
	uint64_t t = now_ns();

	while (nl_stats_one(ctl, pidns, &s, NULL) == 1 && s.blocked < want &&
	       now_ns() - t < 5000000000ull)
		usleep(5000);
	return s.blocked;
}

static int recv_notice(struct gpushare_kmod_notice *n)
{
	static struct kmodctl_reply r;
	int ret = nl_recv(rcv, &r, 5000);

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
	add = cmd1(GPUSHARE_KMOD_CMD_ADD, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	got = owner_result(&o, &r, 5000);
	printf("RESULT nodetect add=%d got=%d ret=%d err=%d elapsed_us=%llu notice_pending=%d",
	       add, got, r.ret, r.err,
	       (unsigned long long)(r.end_ns - r.start_ns) / 1000, nl_pending(rcv));
	nl_stats_one(ctl, o.pidns, &s, NULL);
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
	det = cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	t0 = now_ns();
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	held = !owner_result(&o, &r, HOLD_MS);
	trel = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	got = owner_result(&o, &r, 5000);
	owner_go(&o, TYPE_NV, 1);
	got2 = owner_result(&o, &r2, 5000);
	extra = nl_pending(rcv);
	nl_stats_one(ctl, o.pidns, &s, &h);
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

static int write_timeout(unsigned int ms)
{
	FILE *f = fopen("/sys/module/gpushare/parameters/timeout_ms", "w");

	if (!f)
		return -errno;
	fprintf(f, "%u\n", ms);
	return fclose(f) ? -errno : 0;
}

static void check_timeout(unsigned int ms)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	struct owner o;
	int set, got_notice, got;

	set = write_timeout(ms);
	owner_start(&o);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	got = owner_result(&o, &r, 10000);
	nl_stats_one(ctl, o.pidns, &s, NULL);
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

static void check_filter(void)
{
	uint64_t self = pidns_of(getpid()), t;
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	unsigned long long init_us;
	struct owner o;
	int det_init, got, flags_after;

	det_init = cmd1(GPUSHARE_KMOD_CMD_DETECT, self);
	t = now_ns();
	ioctl_loop(TYPE_NV, 1);
	init_us = us_since(t);
	printf("RESULT initns detect=%d elapsed_us=%llu notice_pending=%d\n",
	       det_init, init_us, nl_pending(rcv));
	cmd1(GPUSHARE_KMOD_CMD_DELETE, self);

	owner_start(&o);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_OTHER, 1);
	got = owner_result(&o, &r, 5000);
	nl_stats_one(ctl, o.pidns, &s, NULL);
	cmd1(GPUSHARE_KMOD_CMD_UNDETECT, o.pidns);
	flags_after = 0;
	{
		struct gpushare_kmod_stats s2 = {};

		nl_stats_one(ctl, o.pidns, &s2, NULL);
		flags_after = s2.flags;
	}
	printf("RESULT othertype got=%d err=%d elapsed_us=%llu notice_pending=%d"
	       " hits=%llu flags=%u flags_after_undetect=%d\n",
	       got, r.err, (unsigned long long)(r.end_ns - r.start_ns) / 1000,
	       nl_pending(rcv), (unsigned long long)s.hits, s.flags, flags_after);
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
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 2);
	got_notice = recv_notice(&n);
	blocked = wait_blocked(o.pidns, 2);
	extra = nl_pending(rcv);
	trel = now_ns();
	rel = cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	for (i = 0; i < 2; i++)
		got += owner_result(&o, &r[i], 5000);
	nl_stats_one(ctl, o.pidns, &s, NULL);
	printf("RESULT threads notice=%d blocked=%u extra_notice=%d release=%d"
	       " got=%d unblock0_us=%lld unblock1_us=%lld notices=%llu hits=%llu\n",
	       got_notice, blocked, extra, rel, got,
	       (long long)(r[0].end_ns - trel) / 1000,
	       (long long)(r[1].end_ns - trel) / 1000,
	       (unsigned long long)s.notices, (unsigned long long)s.hits);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

static void check_fatal(void)
{
	struct gpushare_kmod_notice n = {};
	struct gpushare_kmod_stats s = {};
	struct owner o;
	int got_notice;
	uint64_t t;

	owner_start(&o);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	got_notice = recv_notice(&n);
	wait_blocked(o.pidns, 1);
	t = now_ns();
	kill(o.pid, SIGKILL);
	waitpid(o.pid, NULL, 0);
	printf("RESULT fatal notice=%d reaped_ms=%llu", got_notice,
	       (unsigned long long)us_since(t) / 1000);
	nl_stats_one(ctl, o.pidns, &s, NULL);
	printf(" blocked_after=%u\n", s.blocked);
	close(o.go_w);
	close(o.res_r);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}

static void check_config(void)
{
	struct gpushare_kmod_config cfg = {}, now = {};
	struct gpushare_kmod_notice n = {};
	struct owner_result r = {};
	int get, set1, set2, notice1, notice2, bad;
	struct owner o;

	get = nl_cmd_payload(ctl, GPUSHARE_KMOD_CMD_CONFIG, 0, NULL, 0, &rep);
	memcpy(&now, rep.items, sizeof(now));
	cfg = now;
	cfg.nmajors = 1;
	cfg.majors[0] = 1;	/* /dev/null is char 1:3 */
	set1 = nl_cmd_payload(ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &rep);
	owner_start(&o);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	notice1 = recv_notice(&n);
	cmd1(GPUSHARE_KMOD_CMD_RELEASE, o.pidns);
	owner_result(&o, &r, 5000);
	cfg.majors[0] = 195;	/* a GPU's major, not /dev/null's */
	set2 = nl_cmd_payload(ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &rep);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	owner_result(&o, &r, 5000);
	notice2 = nl_pending(rcv);
	cfg.nmajors = 99;
	bad = nl_cmd_payload(ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &cfg, sizeof(cfg), &rep);
	nl_cmd_payload(ctl, GPUSHARE_KMOD_CMD_CONFIG, 1, &now, sizeof(now), &rep);
	printf("RESULT config get=%d ntypes=%u type0=%u nmajors=%u set_major1=%d"
	       " notice_major1=%d set_major195=%d notice_major195=%d bad=%d\n",
	       get, now.ntypes, now.types[0], now.nmajors, set1, notice1, set2,
	       notice2, bad);
	owner_stop(&o);
	cmd1(GPUSHARE_KMOD_CMD_DELETE, o.pidns);
}


/* The receiver is gone: the notice is dropped, the owner waits the timeout. */
static void check_dead_receiver(int unit, unsigned int ms)
{
	struct gpushare_kmod_stats_head h0 = {}, h1 = {};
	struct gpushare_kmod_stats s = {};
	struct owner_result r = {};
	int dead = nl_open(unit), reg, got;
	struct owner o;

	reg = nl_cmd(dead, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &rep);
	close(dead);
	write_timeout(ms);
	owner_start(&o);
	nl_stats_one(ctl, o.pidns, &s, &h0);
	cmd1(GPUSHARE_KMOD_CMD_DETECT, o.pidns);
	owner_go(&o, TYPE_NV, 1);
	got = owner_result(&o, &r, 10000);
	nl_stats_one(ctl, o.pidns, &s, &h1);
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

int run_checks(int unit)
{
	ctl = nl_open(unit);
	rcv = nl_open(unit);
	if (ctl < 0 || rcv < 0) {
		printf("RESULT open ctl=%d rcv=%d\n", ctl, rcv);
		return 1;
	}
	printf("RESULT register status=%d\n",
	       nl_cmd(rcv, GPUSHARE_KMOD_CMD_REGISTER, NULL, 0, &rep));
	check_nodetect();
	check_detect();
	check_filter();
	check_threads();
	check_fatal();
	check_config();
	check_timeout(700);
	refused_checks(ctl, unit, &rep);
	check_dead_receiver(unit, 700);
	fflush(stdout);
	close(ctl);
	close(rcv);
	return 0;
}
