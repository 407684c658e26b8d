// SPDX-License-Identifier: GPL-2.0
/*
 * gpushare-kmodctl: commands the module must refuse, each answered by a
 * status reply and never a crash: malformed, truncated, oversize and
 * unprivileged ones. Prints one RESULT line of reply statuses.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <linux/netlink.h>

#include "kmodctl.h"

static int send_hdr(int fd, uint16_t type, struct gpushare_kmod_hdr *h,
		    const void *items, size_t len, size_t cut,
		    struct kmodctl_reply *r)
{
	static unsigned char msg[KMODCTL_BUF];
	size_t total = sizeof(*h) + len - cut;
	int ret;

	memcpy(msg, h, sizeof(*h));
	memcpy(msg + sizeof(*h), items, len);
	ret = nl_send(fd, type, h->seq, msg, total);
	if (ret)
		return ret;
	ret = nl_recv(fd, r, 5000);
	if (ret <= 0)
		return ret ? ret : -ETIME;
	return r->hdr.status;
}

/* count in the header, nitems items of the command's size after it. */
static int bad(int fd, uint16_t cmd, uint32_t count, size_t nitems,
	       uint16_t version, struct kmodctl_reply *r)
{
	static struct gpushare_kmod_target items[GPUSHARE_KMOD_MAX_IDS + 8];
	struct gpushare_kmod_hdr h = {
		.version = version, .cmd = cmd, .seq = 77, .count = count,
	};
	uint64_t *ids = (uint64_t *)items;
	size_t i, size = 8;

	for (i = 0; i < nitems; i++) {
		if (cmd == GPUSHARE_KMOD_CMD_ADD) {
			items[i] = (struct gpushare_kmod_target) {
				.pidns = 4026532000ull + i, .pid = getpid() };
			size = sizeof(items[0]);
		} else {
			ids[i] = 4026532000ull + i;
		}
	}
	return send_hdr(fd, GPUSHARE_KMOD_MSG_CMD, &h, items, nitems * size, 0, r);
}

/* ADD with items of protocol version 1 (bare ids) under the current version. */
static int old_items(int fd, struct kmodctl_reply *r)
{
	uint64_t ids[2] = { 4026532000ull, 4026532001ull };
	struct gpushare_kmod_hdr h = {
		.version = GPUSHARE_KMOD_VERSION, .cmd = GPUSHARE_KMOD_CMD_ADD,
		.seq = 80, .count = 2,
	};

	return send_hdr(fd, GPUSHARE_KMOD_MSG_CMD, &h, ids, sizeof(ids), 0, r);
}

static int bad_target(int fd, uint64_t id, uint32_t pid, uint32_t pad,
		      struct kmodctl_reply *r)
{
	struct gpushare_kmod_target t = { .pidns = id, .pid = pid, .pad = pad };

	return nl_cmd_payload(fd, GPUSHARE_KMOD_CMD_ADD, 1, &t, sizeof(t), r);
}

static int tiny(int fd, struct kmodctl_reply *r)
{
	unsigned char junk[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	int ret = nl_send_raw(fd, junk, sizeof(junk));

	if (ret)
		return ret;
	ret = nl_recv(fd, r, 5000);
	return ret <= 0 ? (ret ? ret : -ETIME) : r->hdr.status;
}

static int truncated(int fd, struct kmodctl_reply *r)
{
	struct gpushare_kmod_hdr h = {
		.version = GPUSHARE_KMOD_VERSION, .cmd = GPUSHARE_KMOD_CMD_ADD,
		.seq = 78, .count = 1,
	};
	struct gpushare_kmod_target t = { .pidns = 4026532999ull, .pid = 1 };

	/* the header itself cut short: 16 + 16 - 28 = 4 bytes of payload */
	return send_hdr(fd, GPUSHARE_KMOD_MSG_CMD, &h, &t, sizeof(t), 28, r);
}

static int wrong_type(int fd, struct kmodctl_reply *r)
{
	struct gpushare_kmod_hdr h = {
		.version = GPUSHARE_KMOD_VERSION, .cmd = GPUSHARE_KMOD_CMD_ADD,
		.seq = 79, .count = 0,
	};

	return send_hdr(fd, GPUSHARE_KMOD_MSG_NOTICE, &h, NULL, 0, 0, r);
}

/* ADD from a process without CAP_NET_ADMIN (uid 65534). */
static int unprivileged(int unit)
{
	int p[2], status = -ETIME;
	pid_t pid;

	if (pipe(p) < 0)
		return -errno;
	pid = fork();
	if (pid == 0) {
		static struct kmodctl_reply r;
		pid_t self = getpid();
		int fd, st = -EIO;

		if (setgid(65534) == 0 && setuid(65534) == 0) {
			fd = nl_open(unit);
			st = fd < 0 ? fd : nl_target(fd, GPUSHARE_KMOD_CMD_ADD,
						     pidns_of(self), self, &r);
		}
		if (write(p[1], &st, sizeof(st)) != sizeof(st))
			_exit(1);
		_exit(0);
	}
	close(p[1]);
	if (read(p[0], &status, sizeof(status)) != sizeof(status))
		status = -EIO;
	close(p[0]);
	waitpid(pid, NULL, 0);
	return status;
}

int refused_checks(int fd, int unit, struct kmodctl_reply *r)
{
	const uint16_t v = GPUSHARE_KMOD_VERSION;
	struct gpushare_kmod_stats_head h;
	int s[19], entries;

	s[0] = tiny(fd, r);
	s[1] = truncated(fd, r);
	s[2] = bad(fd, GPUSHARE_KMOD_CMD_ADD, 2, 1, v, r);	/* short */
	s[3] = bad(fd, GPUSHARE_KMOD_CMD_ADD, 1, 2, v, r);	/* long */
	s[4] = bad(fd, GPUSHARE_KMOD_CMD_ADD, GPUSHARE_KMOD_MAX_IDS + 1,
		   GPUSHARE_KMOD_MAX_IDS + 1, v, r);		/* oversize */
	s[5] = bad(fd, GPUSHARE_KMOD_CMD_ADD, 0xffffffffu, 1, v, r);
	s[6] = bad(fd, GPUSHARE_KMOD_CMD_ADD, 1, 1, v - 1, r);	/* version 1 */
	s[7] = bad(fd, 99, 0, 0, v, r);				/* unknown */
	s[8] = bad(fd, GPUSHARE_KMOD_CMD_REGISTER, 1, 1, v, r);
	s[9] = bad(fd, GPUSHARE_KMOD_CMD_CONFIG, 1, 1, v, r);	/* 8 != 88 */
	s[10] = bad_target(fd, 0, getpid(), 0, r);		/* zero id */
	s[11] = bad_target(fd, 1ull << 40, getpid(), 0, r);	/* big id */
	s[12] = wrong_type(fd, r);
	s[13] = unprivileged(unit);
	s[14] = bad_target(fd, pidns_of(getpid()), 0, 0, r);	/* pid 0 */
	s[15] = bad_target(fd, pidns_of(getpid()), getpid(), 1, r); /* pad */
	s[16] = old_items(fd, r);				/* 2 x 8 bytes */
	s[17] = bad(fd, GPUSHARE_KMOD_CMD_NOTICE, 0, 0, v, r);	/* not a command */
	s[18] = bad(fd, GPUSHARE_KMOD_CMD_HOLD, 0, 1, v, r);	/* long */
	nl_cmd(fd, GPUSHARE_KMOD_CMD_STATS, NULL, 0, r);
	memcpy(&h, r->items, sizeof(h));
	entries = h.entries;
	printf("RESULT refused tiny=%d truncated=%d short=%d long=%d oversize=%d"
	       " huge_count=%d version=%d unknown=%d register_items=%d"
	       " config_size=%d zero_id=%d big_id=%d wrong_type=%d"
	       " unprivileged=%d zero_pid=%d pad=%d old_items=%d notice_cmd=%d"
	       " hold_long=%d entries_after=%d\n",
	       s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9],
	       s[10], s[11], s[12], s[13], s[14], s[15], s[16], s[17], s[18],
	       entries);
	return 0;
}
