/* Shared node state: attach, robust locking, process reaping, memory, time model, faults. */
#define _GNU_SOURCE
#include "simstate.h"
#include "migtable.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static struct sim_state *g_state;
static pthread_mutex_t g_attach_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_error[512];
static int g_fd = -1;          /* kept open: the OFD locks on it say this process is alive */
static char g_path[4096];      /* the state file, for a fork child's own descriptor */

/* Per-process faults from TESSERA_SIM_FAULTS. */
static struct sim_fault g_env_fault[SIM_MAX_FAULTS];
static int g_env_faults;
static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;

static void set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
}

const char *sim_last_error(void) { return g_error; }
struct sim_state *sim_state(void) { return g_state; }

void sim_copy_str(char *dst, size_t cap, const char *src)
{
    if (cap == 0)
        return;
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* GPU instance IDs are the node numbers of a binary tree over the memory slices: the
 * whole GPU is 0, halves 1-2, quarters 3-6, eighths 7-14 (A30: 0, 1-2, 3-6).  This is
 * what real A100/H100 report (1g at slot s -> 7+s, 2g at 0/2/4 -> 3/4/5, 3g -> 1/2). */
uint32_t sim_gi_tree_id(uint32_t total_slices, uint32_t start, uint32_t size)
{
    uint32_t level_nodes = total_slices / (size ? size : 1);
    return (level_nodes - 1) + start / (size ? size : 1);
}

/* ---------------------------------------------------------------- node description */

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

static int parse_u64(const char *v, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 0);
    if (errno || end == v || *end != '\0' || v[0] == '-')
        return -1;
    *out = x;
    return 0;
}

/* `nvlink=1,1,3`: the GPU index at the other end of links 0, 1, 2 (empty: no link). */
static int parse_nvlinks(struct sim_gpu *gpu, char *val)
{
    int link = 0;
    char *save = NULL;
    for (int l = 0; l < SIM_NVLINKS; l++)
        gpu->nvlink[l] = -1;
    for (char *item = strtok_r(val, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        uint64_t peer = 0;
        if (link >= SIM_NVLINKS || parse_u64(trim(item), &peer) || peer >= SIM_MAX_GPUS)
            return -1;
        gpu->nvlink[link++] = (int32_t)peer;
    }
    return 0;
}

/* Every link's far end is another GPU of the node, and each pair has as many links seen
 * from either end. */
static int check_nvlinks(const struct sim_state *st, const char *path)
{
    for (uint32_t i = 0; i < st->ngpus; i++) {
        for (int l = 0; l < SIM_NVLINKS; l++) {
            int32_t peer = st->gpu[i].nvlink[l];
            if (peer < 0)
                continue;
            if ((uint32_t)peer >= st->ngpus || (uint32_t)peer == i) {
                set_error("%s: gpu %u: nvlink %d leads to gpu %d, not another GPU of the node",
                          path, i, l, peer);
                return -1;
            }
            int here = 0, there = 0;
            for (int k = 0; k < SIM_NVLINKS; k++) {
                here += st->gpu[i].nvlink[k] == peer;
                there += st->gpu[peer].nvlink[k] == (int32_t)i;
            }
            if (here != there) {
                set_error("%s: gpu %u has %d nvlinks to gpu %d, which has %d back", path, i,
                          here, peer, there);
                return -1;
            }
        }
    }
    return 0;
}

static int parse_node(struct sim_state *st, char *text, const char *path)
{
    int lineno = 0;
    struct sim_gpu *gpu = NULL;
    char *save = NULL;
    st->launch_queue_depth = 1024;
    st->default_ns_per_block = 1000;
    st->context_mib = 0;
    st->cuda_driver_version = 12090;
    sim_copy_str(st->driver_version, sizeof st->driver_version, "575.57.08");
    sim_copy_str(st->nvml_version, sizeof st->nvml_version, "12.575.57.08");
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        char *s = trim(line);
        if (*s == '\0' || *s == '#')
            continue;
        if (strcmp(s, "[node]") == 0) {
            gpu = NULL;
            continue;
        }
        if (strcmp(s, "[gpu]") == 0) {
            if (st->ngpus >= SIM_MAX_GPUS) {
                set_error("%s:%d: more than %d GPUs", path, lineno, SIM_MAX_GPUS);
                return -1;
            }
            gpu = &st->gpu[st->ngpus++];
            gpu->mig_table = -1;
            for (int l = 0; l < SIM_NVLINKS; l++)
                gpu->nvlink[l] = -1;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            set_error("%s:%d: expected key=value, [node] or [gpu]", path, lineno);
            return -1;
        }
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        uint64_t n = 0;
        int bad = 0;
        if (!gpu) {
            if (strcmp(key, "driver_version") == 0)
                sim_copy_str(st->driver_version, sizeof st->driver_version, val);
            else if (strcmp(key, "nvml_version") == 0)
                sim_copy_str(st->nvml_version, sizeof st->nvml_version, val);
            else if (strcmp(key, "cuda_driver_version") == 0)
                bad = parse_u64(val, &n) || !(st->cuda_driver_version = (int32_t)n);
            else if (strcmp(key, "default_ns_per_block") == 0)
                bad = parse_u64(val, &st->default_ns_per_block);
            else if (strcmp(key, "launch_queue_depth") == 0)
                bad = parse_u64(val, &n) || n == 0 || n > 65536 ||
                      !(st->launch_queue_depth = (uint32_t)n);
            else if (strcmp(key, "context_mib") == 0)
                bad = parse_u64(val, &st->context_mib);
            else {
                set_error("%s:%d: unknown node key '%s'", path, lineno, key);
                return -1;
            }
        } else {
            if (strcmp(key, "model") == 0)
                sim_copy_str(gpu->model_id, sizeof gpu->model_id, val);
            else if (strcmp(key, "name") == 0)
                sim_copy_str(gpu->name, sizeof gpu->name, val);
            else if (strcmp(key, "uuid") == 0)
                sim_copy_str(gpu->uuid, sizeof gpu->uuid, val);
            else if (strcmp(key, "pci_bus_id") == 0)
                sim_copy_str(gpu->pci_bus_id, sizeof gpu->pci_bus_id, val);
            else if (strcmp(key, "pci_device_id") == 0)
                bad = parse_u64(val, &n) || n > 0xffffffffULL || !(gpu->pci_device_id = (uint32_t)n);
            else if (strcmp(key, "memory_mib") == 0)
                bad = parse_u64(val, &gpu->memory_mib) || gpu->memory_mib == 0;
            else if (strcmp(key, "sm_count") == 0)
                bad = parse_u64(val, &n) || n == 0 || n > 4096 || !(gpu->sm_count = (uint32_t)n);
            else if (strcmp(key, "compute_capability") == 0)
                bad = sscanf(val, "%d.%d", &gpu->cc_major, &gpu->cc_minor) != 2;
            else if (strcmp(key, "mig_mode") == 0)
                bad = parse_u64(val, &n) || n > 1 || ((gpu->mig_current = gpu->mig_pending = (int32_t)n), 0);
            else if (strcmp(key, "numa_node") == 0)
                bad = parse_u64(val, &n) || n > 1023 || ((gpu->numa_node = (int32_t)n), 0);
            else if (strcmp(key, "nvlink") == 0)
                bad = parse_nvlinks(gpu, val);
            else if (strcmp(key, "mig_mode_change") == 0) {
                if (strcmp(val, "reset") == 0)
                    gpu->mig_needs_reset = 1;
                else if (strcmp(val, "immediate") == 0)
                    gpu->mig_needs_reset = 0;
                else
                    bad = 1;
            } else {
                set_error("%s:%d: unknown gpu key '%s'", path, lineno, key);
                return -1;
            }
        }
        if (bad) {
            set_error("%s:%d: bad value '%s' for '%s'", path, lineno, val, key);
            return -1;
        }
    }
    if (st->ngpus == 0) {
        set_error("%s: no [gpu] section", path);
        return -1;
    }
    for (uint32_t i = 0; i < st->ngpus; i++) {
        struct sim_gpu *g = &st->gpu[i];
        if (!g->model_id[0] || !g->name[0] || !g->uuid[0] || !g->memory_mib || !g->sm_count) {
            set_error("%s: gpu %u needs model, name, uuid, memory_mib and sm_count", path, i);
            return -1;
        }
        if (strncmp(g->uuid, "GPU-", 4) != 0) {
            set_error("%s: gpu %u: uuid must start with GPU-", path, i);
            return -1;
        }
        if (!g->pci_bus_id[0])
            snprintf(g->pci_bus_id, sizeof g->pci_bus_id, "00000000:%02X:00.0", 0x17 + 0x10 * i);
        if (!g->cc_major) {
            g->cc_major = 8;
            g->cc_minor = 0;
        }
        g->mig_table = sim_mig_table_for(g->model_id);
        if (g->mig_table < 0)
            g->mig_current = g->mig_pending = 0;
    }
    return check_nvlinks(st, path);
}

static char *read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        set_error("cannot open node description %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            set_error("cannot read %s: %s", path, strerror(errno));
            free(buf);
            buf = NULL;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (!buf) {
        if (!g_error[0])
            set_error("out of memory reading %s", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int init_state(struct sim_state *st, const char *node_path, char *text, uint64_t hash)
{
    memset(st, 0, sizeof *st);
    pthread_mutexattr_t ma;
    if (pthread_mutexattr_init(&ma) || pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) ||
        pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) || pthread_mutex_init(&st->lock, &ma)) {
        set_error("cannot initialise the shared mutex");
        return -1;
    }
    pthread_mutexattr_destroy(&ma);
    if (parse_node(st, text, node_path) != 0)
        return -1;
    st->node_hash = hash;
    st->size = sizeof *st;
    __atomic_store_n(&st->magic, SIM_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

static void atfork_child(void);

static void parse_env_faults(void)
{
    const char *spec = getenv("TESSERA_SIM_FAULTS");
    g_env_faults = 0;
    if (!spec || !*spec)
        return;
    char buf[2048];
    sim_copy_str(buf, sizeof buf, spec);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item && g_env_faults < SIM_MAX_FAULTS;
         item = strtok_r(NULL, ",", &save)) {
        /* fn:count:code[:delay_us] */
        char fn[SIM_FN_NAME] = "";
        int count = 0, code = 0;
        unsigned delay = 0;
        if (sscanf(item, "%63[^:]:%d:%d:%u", fn, &count, &code, &delay) < 3) {
            fprintf(stderr, "tessera-sim: ignoring bad TESSERA_SIM_FAULTS entry '%s' "
                            "(want fn:count:code[:delay_us])\n", item);
            continue;
        }
        struct sim_fault *f = &g_env_fault[g_env_faults++];
        sim_copy_str(f->fn, sizeof f->fn, fn);
        f->remaining = count;
        f->code = code;
        f->delay_us = delay;
    }
}

int sim_attach(void)
{
    pthread_mutex_lock(&g_attach_lock);
    if (g_state) {
        pthread_mutex_unlock(&g_attach_lock);
        return 0;
    }
    g_error[0] = '\0';
    int rc = -1, fd = -1;
    char *text = NULL;
    struct sim_state *st = MAP_FAILED;
    const char *node = getenv("TESSERA_SIM_NODE");
    if (!node || !*node) {
        set_error("TESSERA_SIM_NODE is not set (path of the simulated node description)");
        goto out;
    }
    char state_path[4096];
    const char *sp = getenv("TESSERA_SIM_STATE");
    if (sp && *sp)
        sim_copy_str(state_path, sizeof state_path, sp);
    else if ((size_t)snprintf(state_path, sizeof state_path, "%s.state", node) >= sizeof state_path) {
        set_error("state path too long");
        goto out;
    }
    size_t len = 0;
    text = read_file(node, &len);
    if (!text)
        goto out;
    uint64_t hash = fnv1a(text, len) ^ (uint64_t)sizeof(struct sim_state);
    fd = open(state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        set_error("cannot open state file %s: %s", state_path, strerror(errno));
        goto out;
    }
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            set_error("flock %s: %s", state_path, strerror(errno));
            goto out;
        }
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        set_error("fstat %s: %s", state_path, strerror(errno));
        goto out_unlock;
    }
    int fresh = (size_t)sb.st_size != sizeof(struct sim_state);
    if (fresh && (ftruncate(fd, 0) != 0 || ftruncate(fd, sizeof(struct sim_state)) != 0)) {
        set_error("cannot size state file %s: %s", state_path, strerror(errno));
        goto out_unlock;
    }
    st = mmap(NULL, sizeof(struct sim_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) {
        set_error("mmap %s: %s", state_path, strerror(errno));
        goto out_unlock;
    }
    if (fresh || st->magic != SIM_MAGIC || st->size != sizeof *st || st->node_hash != hash) {
        /* New node, or the description changed: start the node afresh. */
        if (init_state(st, node, text, hash) != 0) {
            st->magic = 0;
            goto out_unlock;
        }
        fresh = 1;
    }
    sim_dev_load(state_path, st, fresh);
    rc = 0;
out_unlock:
    flock(fd, LOCK_UN);
out:
    if (fd >= 0 && rc != 0)
        close(fd);
    free(text);
    if (rc == 0) {
        static int atfork_done;
        if (!atfork_done && pthread_atfork(NULL, NULL, atfork_child) == 0)
            atfork_done = 1;
        g_state = st;
        g_fd = fd;
        sim_copy_str(g_path, sizeof g_path, state_path);
        parse_env_faults();
    } else if (st != MAP_FAILED) {
        munmap(st, sizeof *st);
    }
    pthread_mutex_unlock(&g_attach_lock);
    return rc;
}

void sim_detach(void)
{
    pthread_mutex_lock(&g_attach_lock);
    if (g_state)
        munmap(g_state, sizeof *g_state);
    g_state = NULL;
    if (g_fd >= 0)
        close(g_fd); /* drops this copy's locks: the libraries that register never detach */
    g_fd = -1;
    sim_proc_forget_self();
    pthread_mutex_unlock(&g_attach_lock);
}

/* ---------------------------------------------------------------- locking, processes */

int sim_lock(int reap)
{
    if (!g_state && sim_attach() != 0)
        return -1;
    int r = pthread_mutex_lock(&g_state->lock);
    if (r == EOWNERDEAD) {
        /* A holder died mid-update.  Nothing derived is stored, so reaping its slot
         * restores a consistent state. */
        pthread_mutex_consistent(&g_state->lock);
        sim_reap_locked();
    } else if (r != 0) {
        set_error("state lock failed: %s", strerror(r));
        return -1;
    }
    if (reap)
        sim_reap_locked();
    return 0;
}

void sim_unlock(void) { pthread_mutex_unlock(&g_state->lock); }

int sim_state_fd(void) { return g_fd; }

/* A fork child is a new process: it must not share the parent's open file description of
 * the state file (an OFD lock lives as long as any process holds the description). */
static void atfork_child(void)
{
    if (g_fd >= 0) {
        int fd = open(g_path, O_RDWR | O_CLOEXEC);
        if (fd < 0 || dup3(fd, g_fd, O_CLOEXEC) < 0) {
            close(g_fd);
            g_fd = -1;
        }
        if (fd >= 0 && fd != g_fd)
            close(fd);
    }
    sim_proc_forget_self();
}

/* ---------------------------------------------------------------- memory */

uint64_t sim_used_locked(int gpu, int slot)
{
    uint64_t sum = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *p = &g_state->proc[i];
        if (!p->pid)
            continue;
        if (slot >= 0) {
            sum += p->mem[gpu][slot];
        } else {
            for (int t = 0; t < SIM_TARGETS; t++)
                sum += p->mem[gpu][t];
        }
    }
    return sum;
}

uint64_t sim_capacity(int gpu, int slot)
{
    const struct sim_gpu *g = &g_state->gpu[gpu];
    if (slot <= 0)
        return g->memory_mib * MIB;
    const struct sim_gi *gi = &g->gi[slot - 1];
    const struct sim_mig_profile *pr = sim_mig_profile(g->mig_table, gi->profile);
    return pr ? pr->memory_mib * MIB : 0;
}

int sim_charge_locked(int gpu, int slot, uint64_t bytes)
{
    struct sim_proc *self = sim_self_locked();
    if (!self)
        return -1;
    uint64_t cap = sim_capacity(gpu, slot);
    uint64_t used = sim_used_locked(gpu, slot);
    if (used + bytes > cap || used + bytes < used) {
        sim_reap_locked(); /* a dead process may still be counted */
        used = sim_used_locked(gpu, slot);
        if (used + bytes > cap || used + bytes < used)
            return -1;
    }
    self->mem[gpu][slot] += bytes;
    return 0;
}

void sim_uncharge_locked(int gpu, int slot, uint64_t bytes)
{
    struct sim_proc *self = sim_self_locked();
    if (!self)
        return;
    uint64_t *m = &self->mem[gpu][slot];
    *m = *m >= bytes ? *m - bytes : 0;
}

/* ---------------------------------------------------------------- time model */

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Read CLOCK_REALTIME between two CLOCK_MONOTONIC reads: the wall clock's offset from the
 * monotonic one, and how far apart the reads were (a thread preempted between them reads a
 * wrong offset; its reading is not used). */
static uint64_t wall_offset_ns(uint64_t *width_ns)
{
    struct timespec ts;
    uint64_t before = sim_now_ns();
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t after = sim_now_ns();
    *width_ns = after - before;
    uint64_t wall = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    return wall - (before + *width_ns / 2);
}

/* How far the offset must move to be a step of the wall clock (set, or corrected by time
 * sync), not the few microseconds two reads differ by; and the widest reading trusted. */
#define WALL_STEP_NS 2000000ULL
#define WALL_READ_MAX_NS 200000ULL

/* The wall clock's offset from CLOCK_MONOTONIC is kept while it only jitters: a sample's
 * timestamp must come out the same every time it is reported (a caller passes it back as
 * lastSeenTimeStamp, and a microsecond older one re-counted a sample).  When the wall clock
 * is stepped the offset follows it, as the driver's timestamps (the CPU's wall clock) do: a
 * caller comparing them with its own wall clock (a timestamp taken before a workload ran)
 * is not told NOT_FOUND because this process read the offset before the step. */
uint64_t sim_mono_to_wall_us(uint64_t mono_ns)
{
    static uint64_t offset_ns; /* 0: not read yet */
    uint64_t off = __atomic_load_n(&offset_ns, __ATOMIC_ACQUIRE);
    uint64_t width;
    uint64_t fresh = wall_offset_ns(&width);
    for (int tries = 1; width > WALL_READ_MAX_NS && tries < 3; tries++)
        fresh = wall_offset_ns(&width);
    int stepped = off && width <= WALL_READ_MAX_NS &&
                  (fresh > off ? fresh - off : off - fresh) > WALL_STEP_NS;
    if (!off || stepped) {
        if (!__atomic_compare_exchange_n(&offset_ns, &off, fresh, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            fresh = off; /* another thread stored first: use the one every caller sees */
        off = fresh;
    }
    return (mono_ns + off) / 1000ULL;
}

void sim_sleep_until(uint64_t mono_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(mono_ns / 1000000000ULL),
                          .tv_nsec = (long)(mono_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

uint64_t sim_timeline_submit_locked(int gpu, int slot, uint64_t cost_ns, uint64_t now)
{
    struct sim_timeline *tl = &g_state->gpu[gpu].tl[slot];
    struct sim_proc *self = sim_self_locked();
    int32_t pid = self ? self->pid : (int32_t)getpid();
    uint32_t pidns = self ? self->pidns : 0;
    uint64_t start = tl->busy_until_ns > now ? tl->busy_until_ns : now;
    uint64_t end = start + cost_ns;
    tl->busy_until_ns = end;
    if (self)
        self->busy_ns[gpu][slot] += cost_ns;
    if (cost_ns == 0)
        return end;
    /* Merge with the previous interval when the same process runs back to back. */
    if (tl->count > 0) {
        struct sim_busy *last = &tl->ring[(tl->head + SIM_BUSY_RING - 1) % SIM_BUSY_RING];
        if (last->pid == pid && last->pidns == pidns && last->end_ns == start) {
            last->end_ns = end;
            return end;
        }
    }
    struct sim_busy *b = &tl->ring[tl->head];
    b->pid = pid;
    b->pidns = pidns;
    b->start_ns = start;
    b->end_ns = end;
    tl->head = (tl->head + 1) % SIM_BUSY_RING;
    if (tl->count < SIM_BUSY_RING)
        tl->count++;
    return end;
}

uint64_t sim_timeline_busy_locked(int gpu, int slot, const struct sim_proc *p, uint64_t t0, uint64_t t1)
{
    const struct sim_timeline *tl = &g_state->gpu[gpu].tl[slot];
    uint64_t sum = 0;
    for (uint32_t i = 0; i < tl->count; i++) {
        const struct sim_busy *b = &tl->ring[(tl->head + SIM_BUSY_RING - 1 - i) % SIM_BUSY_RING];
        if (p && (b->pid != p->pid || b->pidns != p->pidns))
            continue;
        uint64_t s = b->start_ns > t0 ? b->start_ns : t0;
        uint64_t e = b->end_ns < t1 ? b->end_ns : t1;
        if (e > s)
            sum += e - s;
    }
    return sum;
}

/* ---------------------------------------------------------------- faults */

static int take_fault(struct sim_fault *tab, int n, const char *fn, unsigned *delay)
{
    for (int i = 0; i < n; i++) {
        struct sim_fault *f = &tab[i];
        if (f->remaining == 0 || strcmp(f->fn, fn) != 0)
            continue;
        if (f->remaining > 0)
            f->remaining--;
        *delay = f->delay_us;
        return f->code;
    }
    return -1;
}

int sim_fault(const char *fn)
{
    unsigned delay = 0;
    int code = -1;
    if (g_env_faults) {
        pthread_mutex_lock(&g_fault_lock);
        code = take_fault(g_env_fault, g_env_faults, fn, &delay);
        pthread_mutex_unlock(&g_fault_lock);
    }
    if (code < 0 && g_state && g_state->fault[0].fn[0]) {
        if (sim_lock(0) == 0) {
            code = take_fault(g_state->fault, SIM_MAX_FAULTS, fn, &delay);
            sim_unlock();
        }
    }
    if (code < 0)
        return 0;
    if (delay)
        sim_sleep_until(sim_now_ns() + (uint64_t)delay * 1000ULL);
    return code;
}

int sim_fault_set(const char *fn, int count, int code, unsigned delay_us)
{
    if (!fn || !*fn || strlen(fn) >= SIM_FN_NAME || sim_lock(0) != 0)
        return -1;
    int rc = -1;
    struct sim_fault *free_slot = NULL;
    for (int i = 0; i < SIM_MAX_FAULTS; i++) {
        struct sim_fault *f = &g_state->fault[i];
        if (f->fn[0] && strcmp(f->fn, fn) == 0) {
            free_slot = f;
            break;
        }
        if (!f->fn[0] && !free_slot)
            free_slot = f;
    }
    if (free_slot) {
        /* Entries are packed from the start so that an empty table is one load to check. */
        sim_copy_str(free_slot->fn, sizeof free_slot->fn, fn);
        free_slot->remaining = count;
        free_slot->code = code;
        free_slot->delay_us = delay_us;
        rc = 0;
    }
    sim_unlock();
    return rc;
}

/* ---------------------------------------------------------------- UUIDs */

void sim_mig_uuid(int gpu, int gi_slot, int ci_slot, char *buf, size_t cap)
{
    const struct sim_gpu *g = &g_state->gpu[gpu];
    const struct sim_gi *gi = &g->gi[gi_slot];
    const struct sim_ci *ci = &gi->ci[ci_slot];
    char seed[192];
    int n = snprintf(seed, sizeof seed, "%s/%u/%u/%u/%u", g->uuid, gi->id, ci->id, gi->serial,
                     ci->serial);
    uint64_t a = fnv1a(seed, (size_t)n), b = fnv1a(seed, (size_t)n) * 0x9e3779b97f4a7c15ULL ^ a;
    snprintf(buf, cap, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(a >> 32),
             (unsigned)((a >> 16) & 0xffff), (unsigned)((a & 0x0fff) | 0x5000),
             (unsigned)((b >> 48) & 0x3fff) | 0x8000, (unsigned long long)(b & 0xffffffffffffULL));
}

int sim_uuid_bytes(const char *uuid, unsigned char out[16])
{
    const char *p = uuid;
    if (strncmp(p, "GPU-", 4) == 0 || strncmp(p, "MIG-", 4) == 0)
        p += 4;
    int n = 0;
    while (*p && n < 16) {
        if (*p == '-') {
            p++;
            continue;
        }
        if (!isxdigit((unsigned char)p[0]) || !isxdigit((unsigned char)p[1]))
            return -1;
        char hex[3] = {p[0], p[1], 0};
        out[n++] = (unsigned char)strtoul(hex, NULL, 16);
        p += 2;
    }
    return n == 16 && *p == '\0' ? 0 : -1;
}
