// SPDX-License-Identifier: GPL-2.0
/* gpushare-kmodctl: owner processes, each in its own new pid namespace. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "kmodctl.h"

#define OWNER_MAX_THREADS 8

struct owner_job {
	int fd;
	unsigned int type;
	int res_w;
};

uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

uint64_t pidns_of(pid_t pid)
{
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
	if (stat(path, &st) < 0)
		return 0;
	return st.st_ino;
}

/* n ioctls of type on /dev/null (ENOTTY: the cheapest possible ioctl). */
long ioctl_loop(unsigned int type, long n)
{
	int fd = open("/dev/null", O_RDONLY);
	long i, fails = 0;

	for (i = 0; i < n; i++)
		if (ioctl(fd, _IO(type, 1)) < 0)
			fails++;
	close(fd);
	return fails;
}

/* n TCGETS on a pseudo-terminal: a typical non-GPU ioctl. */
long tty_loop(long n)
{
	int fd = posix_openpt(O_RDWR | O_NOCTTY);
	struct termios t;
	long i, fails = 0;

	if (fd < 0)
		return n;
	for (i = 0; i < n; i++)
		if (ioctl(fd, TCGETS, &t) < 0)
			fails++;
	close(fd);
	return fails;
}

static void *owner_thread(void *arg)
{
	struct owner_job *job = arg;
	struct owner_result res = { .start_ns = now_ns() };

	res.ret = ioctl(job->fd, _IO(job->type, 1));
	res.err = res.ret < 0 ? errno : 0;
	res.end_ns = now_ns();
	if (write(job->res_w, &res, sizeof(res)) != sizeof(res))
		_exit(3);
	return NULL;
}

static void owner_main(int go_r, int res_w)
{
	struct owner_job job = { .res_w = res_w };
	pthread_t th[OWNER_MAX_THREADS];
	unsigned char msg[2];
	unsigned int i;

	job.fd = open("/dev/null", O_RDONLY);
	if (job.fd < 0)
		_exit(2);
	while (read(go_r, msg, sizeof(msg)) == sizeof(msg)) {
		job.type = msg[0];
		for (i = 0; i < msg[1] && i < OWNER_MAX_THREADS; i++)
			pthread_create(&th[i], NULL, owner_thread, &job);
		while (i-- > 0)
			pthread_join(th[i], NULL);
	}
	_exit(0);
}

/* Netlink sockets of the protocol pin the module: the owner keeps none. */
static void owner_close_fds(int keep1, int keep2)
{
	int fd;

	for (fd = 3; fd < 1024; fd++)
		if (fd != keep1 && fd != keep2)
			close(fd);
}

int owner_start(struct owner *o)
{
	int go[2], res[2];
	pid_t pid;

	if (pipe2(go, O_CLOEXEC) < 0 || pipe2(res, O_CLOEXEC) < 0)
		return -errno;
	pid = syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, NULL, NULL, NULL, NULL);
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		owner_close_fds(go[0], res[1]);
		owner_main(go[0], res[1]);
	}
	close(go[0]);
	close(res[1]);
	o->pid = pid;
	o->go_w = go[1];
	o->res_r = res[0];
	o->pidns = pidns_of(pid);
	return o->pidns ? 0 : -ENOENT;
}

int owner_go(struct owner *o, unsigned int type, unsigned int nthreads)
{
	unsigned char msg[2] = { type, nthreads };

	return write(o->go_w, msg, sizeof(msg)) == sizeof(msg) ? 0 : -EIO;
}

int owner_result(struct owner *o, struct owner_result *res, int timeout_ms)
{
	struct pollfd p = { .fd = o->res_r, .events = POLLIN };

	if (poll(&p, 1, timeout_ms) <= 0)
		return 0;
	return read(o->res_r, res, sizeof(*res)) == sizeof(*res);
}

void owner_stop(struct owner *o)
{
	if (o->pid <= 0)
		return;
	close(o->go_w);
	kill(o->pid, SIGKILL);
	waitpid(o->pid, NULL, 0);
	close(o->res_r);
	o->pid = 0;
}
