/*
 * pause - the init of a pod sandbox: it holds the pod's namespaces and does nothing else.
 *
 * Exits 0 on SIGINT or SIGTERM; reaps any child re-parented to it (SIGCHLD) so none
 * stays a zombie. The node simulator imports it as its CRI sandbox image, since no
 * registry is reachable.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int signo)
{
	(void)signo;
	_exit(0);
}

static void reap(int signo)
{
	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

static int on(int signo, void (*handler)(int))
{
	struct sigaction action;

	memset(&action, 0, sizeof(action));
	action.sa_handler = handler;
	action.sa_flags = signo == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : 0;
	return sigaction(signo, &action, NULL);
}

int main(void)
{
	if (on(SIGINT, leave) || on(SIGTERM, leave) || on(SIGCHLD, reap))
		return 1;
	for (;;)
		pause();
}
