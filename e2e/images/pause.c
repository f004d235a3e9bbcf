/* The pod sandbox's process: holds the pod's namespaces until it is told to stop.
 * Same job as Kubernetes' pause (build/pause/linux/pause.c): reap orphaned children when it
 * is the pod's PID 1 and exit on SIGINT/SIGTERM. Linked statically: the image has no libc. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int signum) { _exit(signum == SIGTERM || signum == SIGINT ? 0 : 1); }

static void on_child(int signum) {
    (void)signum;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        puts("tessera-pause");
        return 0;
    }
    if (getpid() != 1)
        fputs("tessera-pause: warning: not PID 1, orphans are not reaped here\n", stderr);
    struct sigaction stop = {.sa_handler = on_stop};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0)
        return 1;
    for (;;)
        pause();
}
