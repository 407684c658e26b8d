/*
 * hog - a borrower that is slow to die, for the soak.
 *
 *   hog [--mib N] [--threads T] [--child]
 *
 * Touches N MiB of anonymous memory (every page, so exiting must unmap them),
 * starts T threads that sleep, and with --child forks a child that leaves the
 * process group (setsid) and holds N/2 MiB of its own; then sleeps until killed.
 * A SIGKILL of the container's init takes the whole pid namespace down, but the
 * exit of each process waits for its memory to be freed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *sleeper(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static void touch(long mib)
{
	size_t size = (size_t)mib << 20;
	char *area = size ? malloc(size) : NULL;

	if (size && !area) {
		fprintf(stderr, "hog: cannot allocate %ld MiB: %s\n", mib, strerror(errno));
		exit(1);
	}
	for (size_t i = 0; i < size; i += 4096)
		area[i] = (char)i;
}

static long number(const char *flag, const char *value, long max)
{
	char *end = NULL;
	long n = value ? strtol(value, &end, 10) : -1;

	if (!value || *end || n < 0 || n > max) {
		fprintf(stderr, "hog: %s wants an integer in [0, %ld]\n", flag, max);
		exit(2);
	}
	return n;
}

int main(int argc, char **argv)
{
	long mib = 0, threads = 0;
	int child = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib"))
			mib = number(argv[i], argv[i + 1], 1 << 20), i++;
		else if (!strcmp(argv[i], "--threads"))
			threads = number(argv[i], argv[i + 1], 4096), i++;
		else if (!strcmp(argv[i], "--child"))
			child = 1;
		else {
			fprintf(stderr, "usage: hog [--mib N] [--threads T] [--child]\n");
			return 2;
		}
	}
	if (child && fork() == 0) {
		setsid();
		touch(mib / 2);
		for (;;)
			pause();
	}
	touch(mib);
	for (long t = 0; t < threads; t++) {
		pthread_t id;

		if (pthread_create(&id, NULL, sleeper, NULL)) {
			fprintf(stderr, "hog: cannot start thread %ld\n", t);
			return 1;
		}
	}
	printf("hog: %ld MiB, %ld threads%s\n", mib, threads, child ? ", a child in its own session" : "");
	fflush(stdout);
	for (;;)
		pause();
}
