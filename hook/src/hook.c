/* libtessera: enforce a container's GPU memory and core budget inside the CUDA driver API
 * and NVML.  See hook/README.md.  Every hooked symbol is listed once, in hooks.def.
 *
 * This file: the table, logging, initialisation (real entry points, budget source, ledger),
 * the ordinal-to-entry map and the process-local records.  Memory paths are in mem.c, the
 * memory views in view.c, launches in launch.c, lookup paths (cuGetProcAddress, dlsym,
 * dlmopen) in lookup.c.
 */
#include "hook.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const struct th_entry th_table[IDX_COUNT] = {
#define H(lib, name, base, ver, ptsz, cls) {#name, #base, ver, ptsz, LIB_##lib, C_##cls, (void *)&name},
#include "hooks.def"
#undef H
};
void *real_ptr[IDX_COUNT];

/* Driver entry points we call but do not hook. */
CUresult (*r_cuCtxGetDevice)(CUdevice *);
CUresult (*r_cuDeviceGetCount)(int *);
CUresult (*r_cuDeviceGetUuid)(CUuuid *, CUdevice);
CUresult (*r_cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
CUresult (*r_cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
CUresult (*r_cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
CUresult (*r_cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
CUresult (*r_cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
CUresult (*r_cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
nvmlReturn_t (*r_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
nvmlReturn_t (*r_nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int *);

/* ---- logging: one line per distinct event ---- */
void th_log(const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "tessera[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

/* ====================================================================================
 * Initialisation: real entry points, budget source, ledger.
 * ==================================================================================== */

pthread_once_t cu_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT,
               budget_once = PTHREAD_ONCE_INIT;
int mode;                       /* MODE_* */
const volatile unsigned char *bmap; /* budget file mapping (MODE_FILE) */
static size_t blen;
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER;

/* Current budget, per entry.  Fields are read without a lock; each is atomic on its own. */
uint64_t cur_gen = UINT64_MAX;   /* generation the values below reflect */
uint32_t cur_ndev;
uint32_t cur_flags[TB_MAX_DEV];
uint64_t cur_limit[TB_MAX_DEV];
uint64_t cur_rate[TB_MAX_DEV];
uint64_t cur_burst[TB_MAX_DEV];
uint8_t cur_uuid[TB_MAX_DEV][16];
uint32_t cur_index[TB_MAX_DEV];
uint64_t cur_ctx[TB_MAX_DEV];
static int ever_valid;

int dev_entry[MAX_ORD];          /* CUDA ordinal -> entry, -2 unknown, -1 none */
uint64_t dev_entry_gen = UINT64_MAX;

/* ledger */
struct tl ledger = {.fd = -1, .slot = -1};
int ledger_state;                /* 0 not tried, 1 joined, -1 unusable */
uint64_t ledger_want_dev, ledger_want_ino; /* the daemon's ledger, as the budget names it */
static pthread_mutex_t ledger_mu = PTHREAD_MUTEX_INITIALIZER;
int64_t credit[TB_MAX_DEV];       /* process-local tokens (x1000) taken from the bucket */

void cu_init(void)
{
    pthread_once(&libc_once, libc_init);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        th_log("cannot load libcuda.so.1: %s", dlerror());
        return;
    }
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_CU)
            real_ptr[i] = tessera_real_dlsym(h, th_table[i].name);
    r_cuCtxGetDevice = (CUresult(*)(CUdevice *))tessera_real_dlsym(h, "cuCtxGetDevice");
    r_cuDeviceGetCount = (CUresult(*)(int *))tessera_real_dlsym(h, "cuDeviceGetCount");
    r_cuDeviceGetUuid = (CUresult(*)(CUuuid *, CUdevice))tessera_real_dlsym(h, "cuDeviceGetUuid_v2");
    if (!r_cuDeviceGetUuid)
        r_cuDeviceGetUuid = (CUresult(*)(CUuuid *, CUdevice))tessera_real_dlsym(h, "cuDeviceGetUuid");
    r_cuGraphGetNodes = (CUresult(*)(CUgraph, CUgraphNode *, size_t *))tessera_real_dlsym(h, "cuGraphGetNodes");
    r_cuGraphNodeGetType = (CUresult(*)(CUgraphNode, CUgraphNodeType *))tessera_real_dlsym(h, "cuGraphNodeGetType");
    r_cuGraphChildGraphNodeGetGraph =
        (CUresult(*)(CUgraphNode, CUgraph *))tessera_real_dlsym(h, "cuGraphChildGraphNodeGetGraph");
    r_cuDevicePrimaryCtxGetState =
        (CUresult(*)(CUdevice, unsigned int *, int *))tessera_real_dlsym(h, "cuDevicePrimaryCtxGetState");
    r_cuDeviceGetMemPool = (CUresult(*)(CUmemoryPool *, CUdevice))tessera_real_dlsym(h, "cuDeviceGetMemPool");
    r_cuMemPoolGetAttribute = (CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *))tessera_real_dlsym(
        h, "cuMemPoolGetAttribute");
}

void nvml_init(void)
{
    pthread_once(&libc_once, libc_init);
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        th_log("cannot load libnvidia-ml.so.1: %s", dlerror());
        return;
    }
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_NVML)
            real_ptr[i] = tessera_real_dlsym(h, th_table[i].name);
    r_nvmlDeviceGetUUID =
        (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int))tessera_real_dlsym(h, "nvmlDeviceGetUUID");
    r_nvmlDeviceGetIndex =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned int *))tessera_real_dlsym(h, "nvmlDeviceGetIndex");
}

static void apply_budget(const struct tb_budget *b)
{
    cur_ndev = b->ndev;
    for (uint32_t i = 0; i < TB_MAX_DEV; i++) {
        const struct tb_dev *d = &b->dev[i];
        int on = i < b->ndev;
        __atomic_store_n(&cur_limit[i], on ? d->mem_limit : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&cur_rate[i], on ? d->rate_milli : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&cur_burst[i], on ? d->burst_milli : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&cur_ctx[i], on ? d->context_bytes : 0, __ATOMIC_RELAXED);
        memcpy(cur_uuid[i], d->uuid, 16);
        cur_index[i] = d->index;
        __atomic_store_n(&cur_flags[i], on ? d->flags : 0, __ATOMIC_RELAXED);
    }
}

/* No valid budget ever seen: memory is refused (limit 0), launches are not throttled. */
static void deny_all(void)
{
    struct tb_budget b;
    memset(&b, 0, sizeof b);
    b.ndev = TB_MAX_DEV;
    for (uint32_t i = 0; i < TB_MAX_DEV; i++) {
        b.dev[i].index = i;
        b.dev[i].flags = TB_DEV_MEM_LIMIT;
    }
    apply_budget(&b);
}

static uint32_t cur_state;        /* header flags of the budget in force (TB_PENDING, ...) */
static uint32_t cur_wait_ms;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The first read of a mapped budget file.  A pending one (the daemon does not know this
 * container's pod yet) is waited for, at most the wait it names, in 10 ms steps; if it is
 * still pending then, device memory stays refused (limit 0) until the daemon writes it. */
static void budget_first_read(void)
{
    budget_reload();
    if (!(__atomic_load_n(&cur_state, __ATOMIC_RELAXED) & TB_PENDING))
        return;
    uint32_t wait = cur_wait_ms;
    uint64_t deadline = now_ms() + wait;
    const struct timespec step = {0, 10 * 1000 * 1000};
    while (now_ms() < deadline) {
        nanosleep(&step, NULL);
        budget_check();
        if (!(__atomic_load_n(&cur_state, __ATOMIC_RELAXED) & TB_PENDING))
            return;
    }
    th_log("budget not ready after %u ms (the node daemon does not know this container's pod "
           "yet): refusing GPU memory", wait);
}

static void budget_init(void)
{
    int fd = open(TB_BUDGET_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT && th_managed()) {
        /* tessera set this container up: it never runs unbudgeted */
        mode = MODE_FILE;
        deny_all();
        th_log("budget file %s missing in a container set up by tessera: refusing GPU memory",
               TB_BUDGET_PATH);
        return;
    }
    if (fd < 0 && errno == ENOENT) {
        const char *m = getenv("TESSERA_MEMORY_LIMIT"), *r = getenv("TESSERA_CORE_RATE"),
                   *b = getenv("TESSERA_CORE_BURST");
        if ((!m || !*m) && (!r || !*r)) {
            mode = MODE_OFF;
            return;
        }
        struct tb_budget bud;
        const char *why = "";
        mode = MODE_ENV;
        if (tb_env_parse(m, r, b, &bud, &why) != TB_OK) {
            th_log("bad TESSERA_MEMORY_LIMIT/TESSERA_CORE_RATE/TESSERA_CORE_BURST (%s): "
                   "refusing device memory", why);
            deny_all();
        } else {
            apply_budget(&bud);
            ever_valid = 1;
        }
        __atomic_store_n(&cur_gen, 0, __ATOMIC_RELEASE);
        return;
    }
    mode = MODE_FILE;
    deny_all();
    const char *why = "unreadable";
    if (fd < 0 || !budget_file_ok(fd, &why)) {
        th_log("budget file %s %s: refusing device memory", TB_BUDGET_PATH, why);
        if (fd >= 0)
            close(fd);
        return;
    }
    blen = TB_FILE_SIZE;
    void *m = mmap(NULL, blen, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        th_log("cannot map budget file %s: refusing device memory", TB_BUDGET_PATH);
        return;
    }
    bmap = m;
    budget_first_read();
}

/* Slow path: the generation moved.  Returns with cur_* updated (or unchanged on failure). */
void budget_reload(void)
{
    pthread_mutex_lock(&reload_mu);
    for (int tries = 0; tries < 10000; tries++) {
        struct tb_budget b;
        const char *why = "";
        uint64_t g = __atomic_load_n((const volatile uint64_t *)(bmap + 8), __ATOMIC_ACQUIRE);
        if (g == __atomic_load_n(&cur_gen, __ATOMIC_ACQUIRE))
            break;
        int r = tb_parse(bmap, blen, &b, &why);
        if (r == TB_TORN) {
            if (tries > 100)
                sched_yield();
            continue;
        }
        if (r == TB_BAD) {
            static uint64_t bad_gen = UINT64_MAX;
            if (bad_gen != g)
                th_log("budget file %s malformed (%s): keeping the %s", TB_BUDGET_PATH, why,
                       ever_valid ? "last valid budget" : "safe default (no device memory)");
            bad_gen = g;
        } else {
            if (b.state & TB_REFUSED) {
                static uint64_t refused_gen = UINT64_MAX;
                if (refused_gen != g)
                    th_log("budget refused by the node daemon: %s: refusing GPU memory",
                           b.reason[0] ? b.reason : "no reason given");
                refused_gen = g;
            }
            if (b.state & (TB_PENDING | TB_REFUSED))
                deny_all();
            else
                apply_budget(&b);
            cur_wait_ms = b.wait_ms;
            ledger_want_dev = b.ledger_dev;
            ledger_want_ino = b.ledger_ino;
            __atomic_store_n(&cur_state, b.state, __ATOMIC_RELAXED);
            ever_valid = 1;
        }
        __atomic_store_n(&cur_gen, g, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&reload_mu);
}

/* Every check: one load and a compare when nothing changed. */

static void atfork_child(void)
{
    /* The child is a new process: it must not hold (or share) the parent's slot. */
    guard_ledger(NULL);
    if (ledger.fd >= 0 || ledger.h)
        tl_forget(&ledger);
    ledger_state = ledger_lost ? -1 : 0; /* a child of a process that lost it: lost too */
    pthread_mutex_init(&ledger_mu, NULL);
    pthread_mutex_init(&reload_mu, NULL);
    memset(credit, 0, sizeof credit);
    th_ptrs_reset_child();
    th_pools_reset_child();
}

void budget_once_fn(void)
{
    budget_init();
    for (int i = 0; i < MAX_ORD; i++)
        dev_entry[i] = -2;
    pthread_atfork(NULL, NULL, atfork_child);
}


struct tl *ledger_get(void)
{
    if (LIKELY(__atomic_load_n(&ledger_state, __ATOMIC_ACQUIRE) == 1))
        return &ledger;
    pthread_mutex_lock(&ledger_mu);
    if (ledger_state == 0) {
        const char *why = "";
        const char *path = TB_LEDGER_PATH;
        char envpath[256];
        if (mode == MODE_ENV) {
            const char *p = getenv("TESSERA_LEDGER");
            if (p && *p)
                path = p;
            else {
                snprintf(envpath, sizeof envpath, "/tmp/tessera-ledger-%u", (unsigned)getuid());
                path = envpath;
            }
        }
        uint64_t dev = mode == MODE_FILE ? ledger_want_dev : 0;
        uint64_t ino = mode == MODE_FILE ? ledger_want_ino : 0;
        tl_on_map = guard_ledger; /* from its first access: a truncation is a loss */
        if (tl_open(&ledger, path, dev, ino, &why) || tl_join(&ledger, &why)) {
            th_log("ledger %s: %s: refusing device memory", path, why);
            guard_ledger(NULL);
            tl_forget(&ledger);
            __atomic_store_n(&ledger_state, -1, __ATOMIC_RELEASE);
        } else {
            int not_yet = 0; /* a SIGBUS meanwhile has made it -1: it stays so */
            __atomic_compare_exchange_n(&ledger_state, &not_yet, 1, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
        }
    }
    if (__atomic_load_n(&ledger_lost, __ATOMIC_RELAXED))
        LOG_ONCE("ledger %s truncated under this process: refusing device memory from now on",
                 TB_LEDGER_PATH);
    pthread_mutex_unlock(&ledger_mu);
    return ledger_state == 1 ? &ledger : NULL;
}


int entry_of_ordinal_slow(int ord, uint64_t g)
{
    if (g != dev_entry_gen) {
        for (int i = 0; i < MAX_ORD; i++)
            __atomic_store_n(&dev_entry[i], -2, __ATOMIC_RELAXED);
        __atomic_store_n(&dev_entry_gen, g, __ATOMIC_RELEASE);
    }
    int e = -1;
    CUuuid u;
    int have_uuid = -1;
    for (uint32_t i = 0; i < cur_ndev && i < TB_MAX_DEV; i++) {
        uint32_t f = __atomic_load_n(&cur_flags[i], __ATOMIC_RELAXED);
        if (f & TB_DEV_UUID) {
            if (have_uuid < 0)
                have_uuid = r_cuDeviceGetUuid && r_cuDeviceGetUuid(&u, ord) == CUDA_SUCCESS;
            if (have_uuid && !memcmp(u.bytes, cur_uuid[i], 16)) {
                e = (int)i;
                break;
            }
        } else if (cur_index[i] == (uint32_t)ord) {
            e = (int)i;
            break;
        }
    }
    __atomic_store_n(&dev_entry[ord], e, __ATOMIC_RELAXED);
    return e;
}


/* ====================================================================================
 * Process-local records: what each allocation / handle / array / graph exec holds.
 * ==================================================================================== */
static struct rec *recs;
static size_t recs_cap, recs_used;
static int recs_mu; /* in-process spinlock: held for a few hundred instructions at most */

static inline void recs_lock(void)
{
    for (unsigned spins = 0; __atomic_exchange_n(&recs_mu, 1, __ATOMIC_ACQUIRE); spins++) {
        if (spins > 100)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}
static inline void recs_unlock(void)
{
    __atomic_store_n(&recs_mu, 0, __ATOMIC_RELEASE);
}

void th_ptrs_reset_child(void)
{
    recs_mu = 0;
    free(recs);
    recs = NULL;
    recs_cap = recs_used = 0;
}

static size_t rhash(uint64_t k, uint8_t kind)
{
    k ^= (uint64_t)kind * 0x9e3779b97f4a7c15ull;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static int recs_grow_locked(void)
{
    size_t ncap = recs_cap ? recs_cap * 2 : 16384; /* 384 KiB, touched lazily */
    struct rec *n = calloc(ncap, sizeof *n);
    if (!n)
        return -1;
    size_t used = 0;
    for (size_t i = 0; i < recs_cap; i++) {
        if (recs[i].kind == 0 || recs[i].kind == 0xff)
            continue;
        size_t j = rhash(recs[i].key, recs[i].kind) & (ncap - 1);
        while (n[j].kind)
            j = (j + 1) & (ncap - 1);
        n[j] = recs[i];
        used++;
    }
    free(recs);
    recs = n;
    recs_cap = ncap;
    recs_used = used;
    return 0;
}

/* With the lock held and room made (rec_room_locked): the slot of (kind, key), or the one it
 * goes into (*added = 1). */
static inline int rec_room_locked(void)
{
    return (recs_used + 1) * 2 <= recs_cap || recs_grow_locked() == 0;
}
static inline __attribute__((always_inline)) size_t rec_slot_locked(uint8_t kind, uint64_t key,
                                                                     int *added)
{
    size_t j = rhash(key, kind) & (recs_cap - 1), tomb = SIZE_MAX;
    while (recs[j].kind) {
        if (recs[j].kind == kind && recs[j].key == key)
            break;
        if (recs[j].kind == 0xff && tomb == SIZE_MAX)
            tomb = j;
        j = (j + 1) & (recs_cap - 1);
    }
    *added = !recs[j].kind;
    if (*added) {
        if (tomb != SIZE_MAX)
            j = tomb;
        else
            recs_used++;
    }
    return j;
}

int rec_put(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    int added;
    recs_lock();
    if (UNLIKELY(!rec_room_locked())) {
        recs_unlock();
        return -1;
    }
    struct rec *r = &recs[rec_slot_locked(kind, key, &added)];
    r->key = key;
    r->bytes = bytes;
    r->entry = entry;
    r->kind = kind;
    recs_unlock();
    return 0;
}

int rec_add(const struct rec *r, int replace)
{
    int added = -1;
    recs_lock();
    if (rec_room_locked()) {
        size_t j = rec_slot_locked(r->kind, r->key, &added);
        if (added || replace)
            recs[j] = *r;
    }
    recs_unlock();
    return added;
}

int rec_get(uint8_t kind, uint64_t key, int take, struct rec *out)
{
    int found = 0;
    recs_lock();
    if (recs_cap) {
        size_t j = rhash(key, kind) & (recs_cap - 1);
        while (recs[j].kind) {
            if (recs[j].kind == kind && recs[j].key == key) {
                *out = recs[j];
                if (take)
                    recs[j].kind = 0xff;
                found = 1;
                break;
            }
            j = (j + 1) & (recs_cap - 1);
        }
    }
    recs_unlock();
    return found;
}


/* ====================================================================================
 * Every hook starts here.
 * ==================================================================================== */
int cu_ready;
void cu_ready_slow(void)
{
    pthread_once(&cu_once, cu_init);
    ensure_budget();
    __atomic_store_n(&cu_ready, 1, __ATOMIC_RELEASE);
}

int ndevices = -1;

/* ---- test support: the table, for the test programs (not part of the API) ---- */
EXPORT int tessera_symbol_count(void);
EXPORT int tessera_symbol_count(void) { return IDX_COUNT; }
EXPORT const char *tessera_symbol_name(int i);
EXPORT const char *tessera_symbol_name(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].name : NULL; }
EXPORT void *tessera_symbol_hook(int i);
EXPORT void *tessera_symbol_hook(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].hook : NULL; }

