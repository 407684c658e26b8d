// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl - drive the gpushare module from user space.
 *
 *   gpushare-kmodctl checks [unit [ioctl32]]  behaviour checks, RESULT lines
 *   gpushare-kmodctl unload [unit]           rmmod while an owner is blocked
 *   gpushare-kmodctl loop TYPE N MAPPED [unit]  ns per ioctl in a new pidns
 *   gpushare-kmodctl release ROUNDS [unit]   release -> unblock latency
 *   gpushare-kmodctl cmd NAME [ID...]        one command, print the reply
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
	[GPUSHARE_KMOD_CMD_CONFIG] = "config",
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
		printf("pidns=%llu hits=%llu notices=%llu blocked=%u flags=%u"
		       " last_access_ns=%llu\n", (unsigned long long)s[i].pidns,
		       (unsigned long long)s[i].hits,
		       (unsigned long long)s[i].notices, s[i].blocked,
		       s[i].flags, (unsigned long long)s[i].last_access_ns);
}

static int one_cmd(int argc, char **argv)
{
	static struct kmodctl_reply r;
	uint64_t ids[64];
	int fd, cmd, i, n = 0, st;

	for (cmd = 1; cmd <= GPUSHARE_KMOD_CMD_CONFIG; cmd++)
		if (!strcmp(argv[2], cmd_names[cmd]))
			break;
	if (cmd > GPUSHARE_KMOD_CMD_CONFIG) {
		fprintf(stderr, "unknown command %s\n", argv[2]);
		return 2;
	}
	for (i = 3; i < argc && n < 64; i++)
		ids[n++] = strtoull(argv[i], NULL, 0);
	fd = nl_open(GPUSHARE_KMOD_NETLINK_UNIT);
	if (fd < 0) {
		fprintf(stderr, "netlink: %s\n", strerror(-fd));
		return 1;
	}
	st = nl_cmd(fd, cmd, ids, n, &r);
	printf("status=%d count=%u\n", st, r.hdr.count);
	if (cmd == GPUSHARE_KMOD_CMD_STATS && st >= 0)
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
