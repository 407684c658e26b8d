/* SPDX-License-Identifier: GPL-2.0 */
/*
 * gpushare-kmodctl - user-space test and benchmark tool for the gpushare
 * module: speaks its netlink protocol and runs owner processes in new pid
 * namespaces that issue ioctls on /dev/null.
 */
#ifndef KMODCTL_H
#define KMODCTL_H

#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

#include "gpushare_kmod.h"

#define KMODCTL_BUF (64 * 1024)

/* ---- netlink (nl.c) ---- */

struct kmodctl_reply {
	struct gpushare_kmod_hdr hdr;
	uint16_t nl_type;
	uint32_t nl_seq;
	size_t items_len;
	unsigned char items[KMODCTL_BUF];
};

int nl_open(int unit);
int nl_send_raw(int fd, const void *buf, size_t len);
int nl_send(int fd, uint16_t type, uint32_t seq, const void *payload,
	    size_t len);
/* 1 when a message arrived, 0 on timeout, -errno on error. */
int nl_recv(int fd, struct kmodctl_reply *r, int timeout_ms);
/* Sends one command and waits for its reply; returns reply status or -ETIME. */
int nl_cmd(int fd, uint16_t cmd, const uint64_t *ids, uint32_t n,
	   struct kmodctl_reply *r);
int nl_cmd_payload(int fd, uint16_t cmd, uint32_t count, const void *items,
		   size_t len, struct kmodctl_reply *r);
int nl_target(int fd, uint16_t cmd, uint64_t pidns, pid_t pid,
	      struct kmodctl_reply *r);
int nl_stats_one(int fd, uint64_t pidns, struct gpushare_kmod_stats *out,
		 struct gpushare_kmod_stats_head *head);
int nl_pending(int fd);

/* ---- owner processes (owner.c) ---- */

struct owner_result {
	int ret;
	int err;
	uint64_t start_ns;
	uint64_t end_ns;
};

struct owner {
	pid_t pid;		/* in the initial pid namespace */
	uint64_t pidns;
	int go_w;
	int res_r;
};

int owner_start(struct owner *o);
/* Asks the owner to issue one ioctl of type in each of nthreads threads. */
int owner_go(struct owner *o, unsigned int type, unsigned int nthreads);
/* 1 with a result, 0 on timeout. */
int owner_result(struct owner *o, struct owner_result *res, int timeout_ms);
void owner_stop(struct owner *o);
uint64_t pidns_of(pid_t pid);
uint64_t now_ns(void);
long ioctl_loop(unsigned int type, long n);
long tty_loop(long n);

/* ---- checks and benchmarks ---- */

#define TYPE_NV 0x46		/* NVIDIA's ioctl type: watched by default */
#define TYPE_OTHER 0x47

/* shared by the checks (checks.c) */
extern struct kmodctl_reply check_rep;
extern int check_ctl, check_rcv;
uint64_t us_since(uint64_t t);
int cmd1(uint16_t cmd, uint64_t id);
/* ADD or DETECT of an owner's namespace (with its pid). */
int at1(uint16_t cmd, const struct owner *o);
int target1(uint16_t cmd, uint64_t pidns, pid_t pid);
int write_param(const char *name, const char *value);
unsigned long read_param(const char *name);
/*
 * How long a check waits for what must come (a notice, the owner's return, a
 * call blocked): it returns as soon as it comes, so the bound only decides when
 * a missing one is reported; a guest in software emulation on a loaded host can
 * take seconds.
 */
#define ARRIVE_MS 30000

unsigned int wait_blocked(uint64_t pidns, unsigned int want);
int recv_notice(struct gpushare_kmod_notice *n);
void check_timeout(unsigned int ms);
void check_fatal(void);
void check_config(void);
void check_dead_receiver(int unit, unsigned int ms);
void check_redetect_and_delete(void);
void check_compat(const char *prog);
void check_churn(long calls);
void check_targets(void);
void check_pin(void);
void check_hold(void);
void check_resend(int unit);
void check_params(void);

int run_checks(int unit, const char *compat_prog);
int refused_checks(int fd, int unit, struct kmodctl_reply *r);
int run_unload_check(int unit, const char *module);
int run_bench_loop(unsigned int type, long n, int in_map, int unit);
int run_bench_release(int unit, int rounds);

#endif
