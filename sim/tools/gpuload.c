/*
 * gpuload - a tiny workload for the node simulator's fake GPUs.
 *
 *   gpuload [--dev PATH|auto] [--util PCT] [--every-ms MS] [--mem-mib MIB] [--once]
 *           [--count N] [--report DIR] [--kmod-sock PATH]
 *
 * Every period it
 *   1. asks the kernel stand-in for permission when its socket exists
 *      (--kmod-sock or $GPULOAD_KMOD_SOCK): sends one JSON line
 *      {"pidns": <inode of /proc/self/ns/pid>, "pid": <pid>, "type": 70}
 *      and waits for one line {"blocked_ms": <float>} (held while the owner
 *      is blocked);
 *   2. issues ioctl(fd, _IOC(_IOC_NONE, 0x46, nr, 0)) on the device node
 *      (ENOTTY is expected on a fake card);
 *   3. reports its utilisation in DIR/<device name>.json (--report or
 *      $GPULOAD_REPORT_DIR), written atomically:
 *      {"dev": "nvidia0", "util": 50, "mem_mib": 0, "pid": 7, "ts": 1.5,
 *       "every_ms": 200, "ioctls": 3, "blocked_ms": 0.0}
 *
 * $GPULOAD_PATH_MAP ("container_path=host_path;...") translates paths when
 * the program runs as a plain process instead of inside a container.
 * --dev auto (the default) takes the lowest /dev/nvidia<N> the container has.
 * On SIGTERM/SIGINT the report is removed; exit status 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GPU_IOCTL_TYPE 0x46
#define MAX_PATH 4096

struct options {
	const char *dev;
	const char *report;
	const char *kmod_sock;
	long util;
	long every_ms;
	long mem_mib;
	long count;
	int once;
};

static volatile sig_atomic_t stopping;

static void on_signal(int sig)
{
	(void)sig;
	stopping = 1;
}

static const char *auto_device(void);

static void usage(const char *why)
{
	fprintf(stderr, "gpuload: %s\n"
		"usage: gpuload [--dev PATH|auto] [--util PCT] [--every-ms MS] [--mem-mib MIB]"
		" [--once] [--count N] [--report DIR] [--kmod-sock PATH]\n", why);
	exit(2);
}

static long number(const char *flag, const char *text, long lo, long hi)
{
	char *end = NULL;
	long value;

	errno = 0;
	value = strtol(text, &end, 10);
	if (errno || !end || *end || end == text || value < lo || value > hi) {
		fprintf(stderr, "gpuload: %s wants an integer in [%ld, %ld], got '%s'\n",
			flag, lo, hi, text);
		exit(2);
	}
	return value;
}

static void parse(int argc, char **argv, struct options *o)
{
	o->report = getenv("GPULOAD_REPORT_DIR");
	o->kmod_sock = getenv("GPULOAD_KMOD_SOCK");
	o->util = 50;
	o->every_ms = 200;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--once")) { o->once = 1; continue; }
		if (!v) usage("missing value or unknown flag");
		if (!strcmp(a, "--dev")) o->dev = v;
		else if (!strcmp(a, "--util")) o->util = number(a, v, 0, 100);
		else if (!strcmp(a, "--every-ms")) o->every_ms = number(a, v, 1, 3600000);
		else if (!strcmp(a, "--mem-mib")) o->mem_mib = number(a, v, 0, 1 << 24);
		else if (!strcmp(a, "--count")) o->count = number(a, v, 1, LONG_MAX);
		else if (!strcmp(a, "--report")) o->report = v;
		else if (!strcmp(a, "--kmod-sock")) o->kmod_sock = v;
		else usage("unknown flag");
		i++;
	}
	if (!o->dev || !strcmp(o->dev, "auto")) o->dev = auto_device();
	if (!o->dev) usage("no --dev given and no /dev/nvidia<N> found");
	if (o->once) o->count = 1;
}

/* The lowest /dev/nvidia<N> listed in $GPULOAD_PATH_MAP or present in /dev. */
static const char *auto_device(void)
{
	static char found[64];
	const char *map = getenv("GPULOAD_PATH_MAP");

	for (int n = 0; n < 64; n++) {
		snprintf(found, sizeof(found), "/dev/nvidia%d", n);
		size_t len = strlen(found);
		for (const char *p = map; p && (p = strstr(p, found)); p += len)
			if ((p == map || p[-1] == ';') && p[len] == '=') return found;
		if (access(found, F_OK) == 0) return found;
	}
	return NULL;
}

/* Translate a container path through $GPULOAD_PATH_MAP (exact or directory prefix). */
static const char *host_path(const char *path, char *buf, size_t len)
{
	const char *map = getenv("GPULOAD_PATH_MAP");
	char copy[MAX_PATH];
	char *save = NULL;

	if (!map || !*map || strlen(map) >= sizeof(copy)) return path;
	strcpy(copy, map);
	for (char *pair = strtok_r(copy, ";", &save); pair; pair = strtok_r(NULL, ";", &save)) {
		char *eq = strchr(pair, '=');
		size_t n;
		if (!eq) continue;
		*eq = '\0';
		n = strlen(pair);
		if (strncmp(path, pair, n) || (path[n] && path[n] != '/')) continue;
		snprintf(buf, len, "%s%s", eq + 1, path + n);
		return buf;
	}
	return path;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Ask the kernel stand-in; returns the milliseconds it held us, or 0 when absent. */
static double ask_permission(const char *sock_path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat ns;
	char line[256];
	ssize_t got;
	size_t used = 0;
	double blocked = 0;
	int fd;

	if (!sock_path || !*sock_path || access(sock_path, F_OK) || stat("/proc/self/ns/pid", &ns))
		return 0;
	if (strlen(sock_path) >= sizeof(addr.sun_path)) return 0;
	strcpy(addr.sun_path, sock_path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) return 0;
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr))) { close(fd); return 0; }
	snprintf(line, sizeof(line), "{\"pidns\": %llu, \"pid\": %d, \"type\": %d}\n",
		 (unsigned long long)ns.st_ino, (int)getpid(), GPU_IOCTL_TYPE);
	if (write(fd, line, strlen(line)) < 0) { close(fd); return 0; }
	while (used < sizeof(line) - 1 && (got = read(fd, line + used, sizeof(line) - 1 - used)) > 0) {
		used += (size_t)got;
		if (memchr(line, '\n', used)) break;
	}
	line[used] = '\0';
	close(fd);
	char *field = strstr(line, "\"blocked_ms\"");
	if (field && (field = strchr(field, ':'))) blocked = strtod(field + 1, NULL);
	return blocked;
}

static void report(const struct options *o, const char *dir, const char *name,
		   long ioctls, double blocked_ms)
{
	char path[MAX_PATH], tmp[MAX_PATH];
	FILE *f;

	if (!dir || !*dir) return;
	snprintf(path, sizeof(path), "%s/%s.json", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, name, (int)getpid());
	f = fopen(tmp, "w");
	if (!f) return;
	fprintf(f, "{\"dev\": \"%s\", \"util\": %ld, \"mem_mib\": %ld, \"pid\": %d, \"ts\": %.3f, "
		"\"every_ms\": %ld, \"ioctls\": %ld, \"blocked_ms\": %.3f}\n",
		name, o->util, o->mem_mib, (int)getpid(), now_s(), o->every_ms, ioctls, blocked_ms);
	if (fclose(f) == 0) rename(tmp, path);
	else unlink(tmp);
}

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L };
	while (!stopping && nanosleep(&ts, &ts) && errno == EINTR)
		;
}

int main(int argc, char **argv)
{
	struct options o = { 0 };
	char dev_buf[MAX_PATH], report_buf[MAX_PATH], sock_buf[MAX_PATH];
	double blocked_total = 0;
	long ioctls = 0;

	parse(argc, argv, &o);
	const char *dev = host_path(o.dev, dev_buf, sizeof(dev_buf));
	const char *dir = o.report ? host_path(o.report, report_buf, sizeof(report_buf)) : NULL;
	const char *sock = o.kmod_sock ? host_path(o.kmod_sock, sock_buf, sizeof(sock_buf)) : NULL;
	const char *name = strrchr(o.dev, '/') ? strrchr(o.dev, '/') + 1 : o.dev;

	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	int fd = open(dev, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "gpuload: cannot open %s: %s\n", dev, strerror(errno));
		return 1;
	}
	printf("gpuload: dev=%s util=%ld every_ms=%ld\n", o.dev, o.util, o.every_ms);
	fflush(stdout);
	while (!stopping) {
		blocked_total += ask_permission(sock);
		if (ioctl(fd, _IOC(_IOC_NONE, GPU_IOCTL_TYPE, 0x2a, 0)) < 0 && errno != ENOTTY)
			fprintf(stderr, "gpuload: ioctl: %s\n", strerror(errno));
		ioctls++;
		report(&o, dir, name, ioctls, blocked_total);
		if (o.count && ioctls >= o.count) break;
		sleep_ms(o.every_ms);
	}
	if (stopping && dir) {
		snprintf(report_buf, sizeof(report_buf), "%s/%s.json", dir, name);
		unlink(report_buf);
	}
	printf("gpuload: done ioctls=%ld blocked_ms=%.3f\n", ioctls, blocked_total);
	close(fd);
	return 0;
}
