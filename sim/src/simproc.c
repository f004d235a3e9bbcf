/* Processes of the simulated node, as the driver knows them.
 *
 * Identity: a process is (PID namespace inode, PID in that namespace, start time).  Inside a
 * container the PID is the container's (often 1), so the PID alone names different processes
 * in different containers; the start time (field 22 of /proc/<pid>/stat) is the same in every
 * namespace.
 *
 * Liveness: a registered process holds an OFD write lock on byte SIM_PROC_LOCK_BASE + slot of
 * the state file, taken through its own open file description of it (close-on-exec; a fork
 * child opens its own).  The kernel drops the lock when the process exits or execs, whatever
 * namespace it is in, as the real driver frees what a process held when its device file
 * closes: a slot whose lock nobody holds is a dead process's, and its memory is freed.
 *
 * Reporting: the real driver reports host PIDs.  A caller is told the PID under which its own
 * /proc shows the process (found by namespace inode, innermost NSpid and start time, and
 * remembered in the slot); a process the caller cannot see is reported under the PID an outer
 * observer (the host) last found it at, or else the PID it has in its own namespace.
 */
#define _GNU_SOURCE
#include "simstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The calling process: identity, and the slot this copy of the library registered. */
static struct {
    int32_t pid;
    uint32_t pidns;
    uint64_t start;
} g_me;
static int g_self_index = -1;

static ssize_t read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n >= 0)
        buf[n] = '\0';
    return n;
}

/* Start time (field 22) of /proc/<pid>/stat, with the state letter; 0 when unreadable. */
static uint64_t start_time_of(const char *pid, char *state_out)
{
    char path[300], buf[1024];
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces and parens */
    if (!p || p[1] != ' ')
        return 0;
    p += 2;
    if (state_out)
        *state_out = *p;
    for (int field = 3; field < 22; field++) { /* field 3 is the state */
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

static uint32_t pidns_of(const char *pid)
{
    char path[300];
    struct stat sb;
    snprintf(path, sizeof path, "/proc/%s/ns/pid", pid);
    return stat(path, &sb) == 0 ? (uint32_t)sb.st_ino : 0;
}

/* Innermost PID of NSpid in /proc/<pid>/status: the PID the process sees itself as. */
static int32_t inner_pid_of(const char *pid)
{
    char path[300], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    if (read_small(path, buf, sizeof buf) <= 0)
        return 0;
    char *line = strstr(buf, "\nNSpid:");
    if (!line)
        return 0;
    line += 7;
    char *end = strchr(line, '\n');
    if (end)
        *end = '\0';
    char *last = strrchr(line, '\t');
    return (int32_t)atoi(last ? last + 1 : line);
}

static void refresh_me(void)
{
    int32_t pid = (int32_t)getpid();
    if (pid == g_me.pid && g_me.start)
        return;
    g_me.pid = pid;
    g_me.pidns = pidns_of("self");
    g_me.start = start_time_of("self", NULL);
}

static int is_me(const struct sim_proc *p)
{
    return p->pid == g_me.pid && p->pidns == g_me.pidns && p->start_time == g_me.start;
}

static int slot_lock(int i, int cmd, short type, struct flock *out)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = SIM_PROC_LOCK_BASE + i;
    fl.l_len = 1;
    int fd = sim_state_fd();
    int rc = fd < 0 ? -1 : fcntl(fd, cmd, &fl);
    if (out)
        *out = fl;
    return rc;
}

/* Someone holds slot i's lock (1), or nobody (0).  Unknown counts as alive: memory stays
 * counted rather than being freed under a live process. */
static int slot_alive(int i)
{
    struct flock fl;
    if (slot_lock(i, F_OFD_GETLK, F_WRLCK, &fl) != 0)
        return 1;
    return fl.l_type != F_UNLCK;
}

void sim_reap_locked(void)
{
    struct sim_state *st = sim_state();
    refresh_me();
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &st->proc[i];
        if (p->pid && !is_me(p) && !slot_alive(i))
            memset(p, 0, sizeof *p); /* the driver frees a dead process's memory */
    }
}

void sim_proc_forget_self(void)
{
    g_self_index = -1;
    g_me.pid = 0;
}

struct sim_proc *sim_self_locked(void)
{
    struct sim_state *st = sim_state();
    refresh_me();
    if (g_self_index >= 0 && is_me(&st->proc[g_self_index]))
        return &st->proc[g_self_index];
    g_self_index = -1;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &st->proc[i];
        if (!is_me(p))
            continue;
        if (slot_alive(i)) { /* registered by the other simulated library of this process */
            g_self_index = i;
            return p;
        }
        memset(p, 0, sizeof *p); /* left by this process's image before an exec */
    }
    sim_reap_locked();
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &st->proc[i];
        if (p->pid != 0 || slot_lock(i, F_OFD_SETLK, F_WRLCK, NULL) != 0)
            continue;
        memset(p, 0, sizeof *p);
        p->pid = g_me.pid;
        p->pidns = g_me.pidns;
        p->start_time = g_me.start;
        for (int g = 0; g < SIM_MAX_GPUS; g++)
            for (int t = 0; t < SIM_TARGETS; t++)
                p->ci[g][t] = -1;
        char buf[64];
        if (read_small("/proc/self/comm", buf, sizeof buf) > 0) {
            buf[strcspn(buf, "\n")] = '\0';
            sim_copy_str(p->name, sizeof p->name, buf);
        }
        g_self_index = i;
        return p;
    }
    return NULL;
}

/* Is /proc/<pid> (in the caller's view) process p? */
static int shows(const char *pid, const struct sim_proc *p)
{
    char state = '?';
    return pidns_of(pid) == p->pidns && start_time_of(pid, &state) == p->start_time &&
           state != 'Z' && state != 'X' && inner_pid_of(pid) == p->pid;
}

void sim_observe_locked(void)
{
    struct sim_state *st = sim_state();
    refresh_me();
    int pending = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &st->proc[i];
        if (!p->pid || p->pidns == g_me.pidns)
            continue;
        char pid[16];
        snprintf(pid, sizeof pid, "%d", p->seen_pid);
        if (p->seen_ns == g_me.pidns && p->seen_pid && shows(pid, p))
            continue;
        pending = 1;
    }
    if (!pending)
        return;
    DIR *dir = opendir("/proc");
    if (!dir)
        return;
    for (struct dirent *e; (e = readdir(dir));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        uint32_t ns = pidns_of(e->d_name);
        if (!ns || ns == g_me.pidns)
            continue;
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            struct sim_proc *p = &st->proc[i];
            if (p->pid && p->pidns == ns && shows(e->d_name, p)) {
                p->seen_pid = (int32_t)atoi(e->d_name);
                p->seen_ns = g_me.pidns;
            }
        }
    }
    closedir(dir);
}

int32_t sim_reported_pid_locked(const struct sim_proc *p)
{
    refresh_me();
    if (p->pidns == g_me.pidns)
        return p->pid;
    return p->seen_pid ? p->seen_pid : p->pid;
}
