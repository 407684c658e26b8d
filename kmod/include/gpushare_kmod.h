/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * gpushare_kmod.h - netlink protocol between the gpushare kernel module and
 * user space (services/kmod-bridge). Shared by the module and user space; it
 * uses only fixed-size types with explicit padding, so every structure has
 * the same size and layout on every architecture (little endian on x86-64).
 *
 * Transport
 *   A raw netlink protocol (not generic netlink): socket(AF_NETLINK, SOCK_RAW,
 *   unit) where unit is the module parameter "nl_unit" (default
 *   GPUSHARE_KMOD_NETLINK_UNIT). Only the initial network namespace.
 *
 * Every message is one netlink message (struct nlmsghdr, 16 bytes) whose
 * payload starts with struct gpushare_kmod_hdr (16 bytes), followed by
 * hdr.count items whose type depends on nlmsg_type and hdr.cmd:
 *
 *   nlmsg_type GPUSHARE_KMOD_MSG_CMD (user -> kernel)
 *     REGISTER   count = 0. The sending socket (its netlink port id) becomes
 *                the one receiver of notices, replacing any previous one.
 *                After the reply, the receiver gets a notice again for every
 *                namespace still being reclaimed (the original pidns, pid,
 *                tid, ioctl and hit time, flags GPUSHARE_KMOD_NOTICE_F_RESENT):
 *                a notice dropped while nobody was registered is not lost.
 *     ADD        count = n, n x struct gpushare_kmod_target: a pid-namespace
 *                id and the host pid of a process in it. Creates a watched
 *                entry per target (idempotent). The module checks that the
 *                process lives and that its active pid namespace has that
 *                id, and holds a reference on the namespace for as long as
 *                the entry exists, so the kernel cannot hand the id to
 *                another namespace while it is watched.
 *     DELETE     count = n, n x __u64 ids. Removes the entries, drops their
 *                namespace references and wakes their blocked tasks (absent
 *                ids are ignored).
 *     DETECT     count = n, n x struct gpushare_kmod_target, checked as for
 *                ADD. Creates the entry when absent and sets need_notice:
 *                the next watched ioctl sends one notice and blocks until
 *                RELEASE, the deadline or a fatal signal.
 *     UNDETECT   count = n, n x __u64 ids. Clears need_notice (absent ids
 *                are ignored); tasks already blocked stay blocked.
 *     RELEASE    count = n, n x __u64 ids. Ends the reclaim of those
 *                namespaces and wakes every task blocked on them.
 *     HOLD       count = n, n x __u64 ids. Moves the deadline of each
 *                namespace being reclaimed to now + timeout_ms, but never
 *                past its hit + max_hold_ms and never earlier than it was
 *                (user space is still killing slow borrowers). Namespaces
 *                not being reclaimed are left alone: a HOLD never starts or
 *                revives a reclaim.
 *     STATS      count = 0 for every entry, or n x __u64 ids for those only.
 *     CONFIG     count = 0 reads the filter; count = 1 followed by one
 *                struct gpushare_kmod_config replaces it.
 *   The payload must be exactly the header plus its items: a shorter,
 *   longer, truncated or oversize (count > GPUSHARE_KMOD_MAX_IDS) message
 *   gets status -EINVAL; a header version other than GPUSHARE_KMOD_VERSION
 *   gets -EPROTO; an unknown cmd gets -EOPNOTSUPP; a sender without
 *   CAP_NET_ADMIN gets -EPERM. A pid-namespace id of 0 or above U32_MAX, a
 *   target pid of 0 or a target pad other than 0 is malformed (-EINVAL).
 *
 *   nlmsg_type GPUSHARE_KMOD_MSG_REPLY (kernel -> sender, one per command)
 *     hdr.cmd and hdr.seq (and nlmsg_seq) copy the command's. hdr.status is
 *     0 or a negative errno; RELEASE and DELETE report in status (>= 0) the
 *     number of tasks they woke, HOLD the number of deadlines it moved.
 *     ADD, DETECT reply (a well-formed command): count = n, n x __s32, the
 *            status of each target in order: 0, -ESRCH (no process with
 *            that pid), -ESTALE (the process is in another pid namespace),
 *            -ENOSPC (the map is full) or -ENOMEM; no entry is created for
 *            a target that failed. hdr.status is the first failure, else 0.
 *     STATS, HOLD reply: one struct gpushare_kmod_stats_head, then
 *            hdr.count x struct gpushare_kmod_stats (at most
 *            GPUSHARE_KMOD_MAX_IDS; ask for ids to see the others). Unknown
 *            ids are left out.
 *     CONFIG reply: count = 1, the filter now in force.
 *     Other replies (and every refused command) carry count = 0, no items.
 *
 *   nlmsg_type GPUSHARE_KMOD_MSG_NOTICE (kernel -> registered receiver)
 *     hdr.cmd = GPUSHARE_KMOD_CMD_NOTICE, hdr.seq = notice sequence number
 *     (increasing from 1), status 0, count = 1, one struct
 *     gpushare_kmod_notice. Sent without blocking: when the receiver is gone
 *     or its buffer is full the notice is dropped (counted in
 *     stats_head.notices_dropped) and sent again when a receiver registers
 *     while the reclaim lasts; a hit and a REGISTER at the same moment may
 *     deliver the same notice twice (same pidns and ts_ns).
 *
 * Reclaim timing (module parameters, both checked when written at run time,
 * 1..GPUSHARE_KMOD_MAX_PARAM_MS, else -EINVAL and the old value stays):
 *   timeout_ms   a hit blocks until hit + timeout_ms unless RELEASE comes
 *                first; each HOLD moves the deadline to now + timeout_ms.
 *   max_hold_ms  no HOLD moves a deadline past hit + max_hold_ms.
 *
 * Clock: every *_ns time is CLOCK_MONOTONIC (ktime_get_ns()) nanoseconds.
 * Pid-namespace id: the inode number of /proc/<pid>/ns/pid.
 */
#ifndef GPUSHARE_KMOD_H
#define GPUSHARE_KMOD_H

#include <linux/types.h>

#define GPUSHARE_KMOD_VERSION		2	/* protocol version, hdr.version */
#define GPUSHARE_KMOD_NETLINK_UNIT	31	/* default netlink protocol number */
#define GPUSHARE_KMOD_MAX_IDS		1024	/* most items in one message */
#define GPUSHARE_KMOD_MAX_TYPES		16	/* most watched ioctl types */
#define GPUSHARE_KMOD_MAX_MAJORS	16	/* most watched device majors */
#define GPUSHARE_KMOD_MAJOR_LIMIT	4096	/* majors are below this */
#define GPUSHARE_KMOD_MAX_PARAM_MS	600000	/* timeout_ms, max_hold_ms at most */

/* nlmsg_type values (>= NLMSG_MIN_TYPE) */
#define GPUSHARE_KMOD_MSG_CMD		0x10
#define GPUSHARE_KMOD_MSG_REPLY		0x11
#define GPUSHARE_KMOD_MSG_NOTICE	0x12

/* hdr.cmd values */
#define GPUSHARE_KMOD_CMD_REGISTER	1
#define GPUSHARE_KMOD_CMD_ADD		2
#define GPUSHARE_KMOD_CMD_DELETE	3
#define GPUSHARE_KMOD_CMD_DETECT	4
#define GPUSHARE_KMOD_CMD_UNDETECT	5
#define GPUSHARE_KMOD_CMD_RELEASE	6
#define GPUSHARE_KMOD_CMD_STATS		7
#define GPUSHARE_KMOD_CMD_CONFIG	8
#define GPUSHARE_KMOD_CMD_NOTICE	9	/* only in notices */
#define GPUSHARE_KMOD_CMD_HOLD		10

/* gpushare_kmod_stats.flags bits */
#define GPUSHARE_KMOD_F_WATCHED		0x1	/* entry counts watched ioctls */
#define GPUSHARE_KMOD_F_NEED_NOTICE	0x2	/* detect mode: next hit notifies */
#define GPUSHARE_KMOD_F_RECLAIMING	0x4	/* notice sent, waiting for release */

/* gpushare_kmod_notice.flags bits */
#define GPUSHARE_KMOD_NOTICE_F_RESENT	0x1	/* sent again on REGISTER */

/* Leads every message payload. 16 bytes. */
struct gpushare_kmod_hdr {
	__u16 version;		/* GPUSHARE_KMOD_VERSION */
	__u16 cmd;		/* GPUSHARE_KMOD_CMD_* */
	__u32 seq;		/* echoed in the reply */
	__s32 status;		/* replies: 0, >= 0 count, or -errno; else 0 */
	__u32 count;		/* number of items that follow */
};

/* ADD, DETECT item: a namespace and a process in it. 16 bytes. */
struct gpushare_kmod_target {
	__u64 pidns;		/* pid-namespace id */
	__u32 pid;		/* a process in it, pid in the initial pid ns */
	__u32 pad;		/* zero */
};

/* STATS, HOLD reply: follows the header, before the records. 48 bytes. */
struct gpushare_kmod_stats_head {
	__u64 now_ns;		/* when the reply was built */
	__u64 notices_sent;	/* notices delivered (also those sent again) */
	__u64 notices_dropped;	/* notices with no receiver or a full buffer */
	__u32 entries;		/* entries in the map */
	__u32 max_entries;	/* module parameter max_entries */
	__u32 receiver_portid;	/* 0 when none registered */
	__u32 timeout_ms;	/* module parameter timeout_ms */
	__u32 max_hold_ms;	/* module parameter max_hold_ms */
	__u32 pad;		/* zero */
};

/* STATS, HOLD reply record, one per pid namespace. 72 bytes. */
struct gpushare_kmod_stats {
	__u64 pidns;		/* pid-namespace id */
	__u64 last_access_ns;	/* last watched ioctl, 0 = never */
	__u64 hits;		/* watched ioctls seen */
	__u64 notices;		/* hits that sent a notice (not counting
				 * the same notice sent again) */
	__u64 releases;		/* reclaims ended by RELEASE */
	__u64 timeouts;		/* reclaims ended by the deadline */
	__u64 holds;		/* HOLDs that moved the deadline */
	__u64 deadline_ns;	/* when the reclaim now in progress ends, else 0 */
	__u32 blocked;		/* tasks blocked now */
	__u32 flags;		/* GPUSHARE_KMOD_F_* */
};

/* CONFIG payload: the ioctl filter. 88 bytes. */
struct gpushare_kmod_config {
	__u32 ntypes;		/* 0..GPUSHARE_KMOD_MAX_TYPES used in types */
	__u32 nmajors;		/* 0 = any file; else the file must be a
				 * character device with one of majors */
	__u8 types[GPUSHARE_KMOD_MAX_TYPES];	/* watched _IOC_TYPE values */
	__u32 majors[GPUSHARE_KMOD_MAX_MAJORS];	/* each < MAJOR_LIMIT */
};

/* NOTICE payload. 32 bytes. */
struct gpushare_kmod_notice {
	__u64 pidns;		/* pid-namespace id of the caller */
	__u64 ts_ns;		/* when the ioctl was caught (the hit) */
	__u32 pid;		/* caller's tgid in the initial pid namespace */
	__u32 tid;		/* caller's thread id in the initial pid ns */
	__u32 ioctl_cmd;	/* the ioctl request number */
	__u32 flags;		/* GPUSHARE_KMOD_NOTICE_F_* */
};

#endif /* GPUSHARE_KMOD_H */
