// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl - drive the gpushare module from user space.
 *
 *   gpushare-kmodctl checks [unit [ioctl32]]  behaviour checks, RESULT lines
 *   gpushare-kmodctl unload [unit]           rmmod while an owner is blocked
 *   gpushare-kmodctl loop TYPE N MAPPED [unit]  ns per ioctl in a new pidns
 *   gpushare-kmodctl release ROUNDS [unit]   release -> unblock latency
 *   gpushare-kmodctl cmd NAME [ID...]        one command, print the reply
 *                                            (add, detect: ID:PID, a process
 *                                            in the namespace)
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmodctl.h"

static const char *const cmd_names[] = {
	[GPUSHARE_KMOD_CMD_REGISTER] = "register", [GPUSHARE_KMOD_CMD_ADD] = "add",
	[GPUSHARE_KMOD_CMD_DELETE] = "delete", [GPUSHARE_KMOD_CMD_DETECT] = "detect",
	[GPUSHARE_KMOD_CMD_UNDETECT] = "undetect",
	[GPUSHARE_KMOD_CMD_RELEASE] = "release", [GPUSHARE_KMOD_CMD_STATS] = "stats",
	[GPUSHARE_KMOD_CMD_CONFIG] = "config", [GPUSHARE_KMOD_CMD_HOLD] = "hold",
};

static int arg_unit(int argc, char **argv, int i)
{
	return argc > i ? atoi(argv[i]) : GPUSHARE_KMOD_NETLINK_UNIT;
}

static void print_stats(const struct kmodctl_reply *r)
{
	const struct gpushare_kmod_stats *s;
	uint32_t i;

	s = (const void *)(r->items + sizeof(struct gpushare_kmod_stats_head));
	for (i = 0; i < r->hdr.count; i++)
		printf("pidns=%llu hits=%llu notices=%llu holds=%llu blocked=%u"
		       " flags=%u last_access_ns=%llu deadline_ns=%llu\n",
		       (unsigned long long)s[i].pidns,
		       (unsigned long long)s[i].hits,
		       (unsigned long long)s[i].notices,
		       (unsigned long long)s[i].holds, s[i].blocked, s[i].flags,
		       (unsigned long long)s[i].last_access_ns,
		       (unsigned long long)s[i].deadline_ns);
}

static int command_number(const char *name)
{
	int cmd;

	for (cmd = 1; cmd <= GPUSHARE_KMOD_CMD_HOLD; cmd++)
		if (cmd_names[cmd] && !strcmp(name, cmd_names[cmd]))
			return cmd;
	return 0;
}

/* add/detect take ID:PID targets, the others bare ids. */
static int send_one(int fd, int cmd, int argc, char **argv,
		    struct kmodctl_reply *r)
{
	static struct gpushare_kmod_target t[64];
	static uint64_t ids[64];
	char *pid;
	int i, n = 0;

	for (i = 3; i < argc && n < 64; i++, n++) {
		ids[n] = strtoull(argv[i], &pid, 0);
		t[n] = (struct gpushare_kmod_target) { .pidns = ids[n] };
		if (*pid == ':')
			t[n].pid = strtoul(pid + 1, NULL, 0);
	}
	if (cmd == GPUSHARE_KMOD_CMD_ADD || cmd == GPUSHARE_KMOD_CMD_DETECT)
		return nl_cmd_payload(fd, cmd, n, t, n * sizeof(t[0]), r);
	return nl_cmd(fd, cmd, ids, n, r);
}

static int one_cmd(int argc, char **argv)
{
	static struct kmodctl_reply r;
	int fd, cmd = command_number(argv[2]), st;

	if (!cmd) {
		fprintf(stderr, "unknown command %s\n", argv[2]);
		return 2;
	}
	fd = nl_open(GPUSHARE_KMOD_NETLINK_UNIT);
	if (fd < 0) {
		fprintf(stderr, "netlink: %s\n", strerror(-fd));
		return 1;
	}
	st = send_one(fd, cmd, argc, argv, &r);
	printf("status=%d count=%u\n", st, r.hdr.count);
	if ((cmd == GPUSHARE_KMOD_CMD_STATS || cmd == GPUSHARE_KMOD_CMD_HOLD) &&
	    st >= 0)
		print_stats(&r);
	return st < 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 2 && !strcmp(argv[1], "checks"))
		return run_checks(arg_unit(argc, argv, 2),
				  argc > 3 ? argv[3] : NULL);
	if (argc >= 2 && !strcmp(argv[1], "unload"))
		return run_unload_check(arg_unit(argc, argv, 2), "gpushare");
	if (argc >= 5 && !strcmp(argv[1], "loop"))
		return run_bench_loop(strtoul(argv[2], NULL, 0), atol(argv[3]),
				      atoi(argv[4]), arg_unit(argc, argv, 5));
	if (argc >= 3 && !strcmp(argv[1], "release"))
		return run_bench_release(arg_unit(argc, argv, 3), atoi(argv[2]));
	if (argc >= 3 && !strcmp(argv[1], "cmd"))
		return one_cmd(argc, argv);
	fprintf(stderr, "usage: %s checks|unload|loop|release|cmd ...\n", argv[0]);
	return 2;
}
