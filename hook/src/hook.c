/* libtessera: enforce a container's GPU memory and core budget inside the CUDA driver API
 * and NVML.  See hook/README.md.  Every hooked symbol is listed once, in hooks.def.
 *
 * Rules: the hook never crashes or hangs its host; no lock is held across a call into the
 * driver; the launch fast path takes no lock, makes no system call and reads no
 * environment variable; nothing in the environment matters while a budget file exists.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <nvml.h>

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "formats.h"
#include "ledger.h"

/* cuda.h maps legacy names onto their current versions; we hook both, under their own names. */
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGetProcAddress

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LIKELY(x) __builtin_expect(!!(x), 1)

/* ---- prototypes of the hooked names cuda.h does not declare under these names ---- */
EXPORT CUresult CUDAAPI cuMemAlloc(unsigned int *dptr, unsigned int bytesize);
EXPORT CUresult CUDAAPI cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch, unsigned int w,
                                        unsigned int h, unsigned int esz);
EXPORT CUresult CUDAAPI cuMemFree(unsigned int dptr);
EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int *free_, unsigned int *total);
EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *a, const void *desc);
EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *a, const void *desc);
EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags);
EXPORT __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
EXPORT __typeof__(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
EXPORT __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
EXPORT __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
EXPORT __typeof__(cuLaunchKernelEx) cuLaunchKernelEx_ptsz;
EXPORT __typeof__(cuLaunchCooperativeKernel) cuLaunchCooperativeKernel_ptsz;
EXPORT __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

/* ---- the table ---- */
enum th_lib { LIB_CU, LIB_NVML };
enum th_class { C_ALLOC, C_FREE, C_INFO, C_LAUNCH, C_LEGACY, C_GRAPH, C_GRAPHMEM, C_PROC };

enum {
#define H(lib, name, base, ver, ptsz, cls) IDX_##name,
#include "hooks.def"
#undef H
    IDX_COUNT
};

struct th_entry {
    const char *name, *base;
    int min_version, ptsz;
    enum th_lib lib;
    enum th_class cls;
    void *hook;
};

static const struct th_entry th_table[IDX_COUNT] = {
#define H(lib, name, base, ver, ptsz, cls) {#name, #base, ver, ptsz, LIB_##lib, C_##cls, (void *)&name},
#include "hooks.def"
#undef H
};

static void *real_ptr[IDX_COUNT];
#define REAL(name) ((__typeof__(&name))real_ptr[IDX_##name])

/* Driver entry points we call but do not hook. */
static CUresult (*r_cuCtxGetDevice)(CUdevice *);
static CUresult (*r_cuDeviceGetCount)(int *);
static CUresult (*r_cuDeviceGetUuid)(CUuuid *, CUdevice);
static CUresult (*r_cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
static CUresult (*r_cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
static CUresult (*r_cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
static nvmlReturn_t (*r_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*r_nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int *);

/* ---- logging: one line per distinct event ---- */
static void th_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void th_log(const char *fmt, ...)
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
#define LOG_ONCE(...)                                                   \
    do {                                                                \
        static int once_;                                               \
        if (!__atomic_exchange_n(&once_, 1, __ATOMIC_RELAXED))          \
            th_log(__VA_ARGS__);                                        \
    } while (0)

/* ====================================================================================
 * glibc's own dlsym/dlvsym/dlmopen, found by walking libc's dynamic symbol table (our own
 * exported dlsym would answer any normal lookup).
 * ==================================================================================== */
HIDDEN void *tessera_dlsym_unavailable(void *h, const char *n);
HIDDEN void *tessera_dlsym_unavailable(void *h, const char *n)
{
    (void)h;
    (void)n;
    return NULL;
}
HIDDEN void *tessera_dlvsym_unavailable(void *h, const char *n, const char *v);
HIDDEN void *tessera_dlvsym_unavailable(void *h, const char *n, const char *v)
{
    (void)h;
    (void)n;
    (void)v;
    return NULL;
}
HIDDEN void *(*tessera_real_dlsym)(void *, const char *) = tessera_dlsym_unavailable;
HIDDEN void *(*tessera_real_dlvsym)(void *, const char *, const char *) = tessera_dlvsym_unavailable;
static void *(*real_dlmopen)(Lmid_t, const char *, int);

/* This runs before anything else is set up (a sanitizer runtime resolves its own
 * interceptors through our dlsym while it initialises): no instrumentation, no libc string
 * functions, no dl_iterate_phdr; the loader's link map is read directly. */
#define NOSAN __attribute__((no_sanitize("address", "undefined"), noinline))

NOSAN static int s_eq(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

NOSAN static int s_has(const char *hay, const char *needle)
{
    for (; *hay; hay++) {
        const char *h = hay, *n = needle;
        while (*n && *h == *n) {
            h++;
            n++;
        }
        if (!*n)
            return 1;
    }
    return 0;
}

NOSAN static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

NOSAN static void *elf_find(const struct link_map *m, const char *sym)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL;
    const ElfW(Half) *versym = NULL;
    for (const ElfW(Dyn) *dyn = m->l_ld; dyn && dyn->d_tag != DT_NULL; dyn++) {
        ElfW(Addr) p = dyn->d_un.d_ptr;
        if (p < m->l_addr)
            p += m->l_addr;
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const void *)p; break;
        case DT_STRTAB: strtab = (const void *)p; break;
        case DT_GNU_HASH: gh = (const void *)p; break;
        case DT_VERSYM: versym = (const void *)p; break;
        default: break;
        }
    }
    if (!symtab || !strtab || !gh)
        return NULL;
    uint32_t nb = gh[0], symoff = gh[1], bloom = gh[2];
    const ElfW(Addr) *bl = (const void *)(gh + 4);
    const uint32_t *buckets = (const void *)(bl + bloom);
    const uint32_t *chain = buckets + nb;
    uint32_t h = gnu_hash(sym);
    uint32_t i = nb ? buckets[h % nb] : 0;
    if (i < symoff)
        return NULL;
    for (;; i++) {
        uint32_t c = chain[i - symoff];
        if ((c | 1) == (h | 1) && s_eq(strtab + symtab[i].st_name, sym) &&
            symtab[i].st_shndx != SHN_UNDEF && (!versym || !(versym[i] & 0x8000)))
            return (void *)(m->l_addr + symtab[i].st_value);
        if (c & 1)
            return NULL;
    }
}

extern struct r_debug _r_debug;

NOSAN static void *libc_sym(const char *name)
{
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next)
        if (m->l_name && s_has(m->l_name, "libc.so.6"))
            return elf_find(m, name);
    return NULL;
}

static int libc_done;
NOSAN static void libc_resolve(void)
{
    if (__atomic_load_n(&libc_done, __ATOMIC_ACQUIRE))
        return;
    void *s = libc_sym("dlsym"), *v = libc_sym("dlvsym"), *m = libc_sym("dlmopen");
    if (s)
        __atomic_store_n(&tessera_real_dlsym, (void *(*)(void *, const char *))s, __ATOMIC_RELAXED);
    if (v)
        __atomic_store_n(&tessera_real_dlvsym, (void *(*)(void *, const char *, const char *))v,
                         __ATOMIC_RELAXED);
    real_dlmopen = (void *(*)(Lmid_t, const char *, int))m;
    __atomic_store_n(&libc_done, 1, __ATOMIC_RELEASE);
}

static pthread_once_t libc_once = PTHREAD_ONCE_INIT;
static void libc_init(void)
{
    libc_resolve();
    if (tessera_real_dlsym == tessera_dlsym_unavailable || !real_dlmopen)
        th_log("cannot find glibc's dlsym/dlvsym/dlmopen; dynamic lookups will fail");
}

/* ====================================================================================
 * Initialisation: real entry points, budget source, ledger.
 * ==================================================================================== */
enum { MODE_OFF, MODE_FILE, MODE_ENV };

static pthread_once_t cu_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT,
                      budget_once = PTHREAD_ONCE_INIT;
static int mode;                       /* MODE_* */
static const volatile unsigned char *bmap; /* budget file mapping (MODE_FILE) */
static size_t blen;
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER;

/* Current budget, per entry.  Fields are read without a lock; each is atomic on its own. */
static uint64_t cur_gen = UINT64_MAX;   /* generation the values below reflect */
static uint32_t cur_ndev;
static uint32_t cur_flags[TB_MAX_DEV];
static uint64_t cur_limit[TB_MAX_DEV];
static uint64_t cur_rate[TB_MAX_DEV];
static uint64_t cur_burst[TB_MAX_DEV];
static uint8_t cur_uuid[TB_MAX_DEV][16];
static uint32_t cur_index[TB_MAX_DEV];
static int ever_valid;

#define MAX_ORD 64
static int dev_entry[MAX_ORD];          /* CUDA ordinal -> entry, -2 unknown, -1 none */
static uint64_t dev_entry_gen = UINT64_MAX;

/* ledger */
static struct tl ledger = {.fd = -1, .slot = -1};
static int ledger_state;                /* 0 not tried, 1 joined, -1 unusable */
static pthread_mutex_t ledger_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t credit[TB_MAX_DEV];       /* process-local tokens (x1000) taken from the bucket */

static void cu_init(void)
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
}

static void nvml_init(void)
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

static void budget_init(void)
{
    int fd = open(TB_BUDGET_PATH, O_RDONLY | O_CLOEXEC);
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
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || st.st_size < (off_t)sizeof(struct tb_file_header)) {
        th_log("budget file %s unreadable or too short: refusing device memory", TB_BUDGET_PATH);
        if (fd >= 0)
            close(fd);
        return;
    }
    blen = (size_t)st.st_size < TB_FILE_SIZE ? (size_t)st.st_size : TB_FILE_SIZE;
    void *m = mmap(NULL, blen, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        th_log("cannot map budget file %s: refusing device memory", TB_BUDGET_PATH);
        return;
    }
    bmap = m;
}

/* Slow path: the generation moved.  Returns with cur_* updated (or unchanged on failure). */
static __attribute__((noinline)) void budget_reload(void)
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
            apply_budget(&b);
            ever_valid = 1;
        }
        __atomic_store_n(&cur_gen, g, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&reload_mu);
}

/* Every check: one load and a compare when nothing changed. */
static inline void budget_check(void)
{
    if (mode == MODE_FILE && LIKELY(bmap != NULL)) {
        uint64_t g = __atomic_load_n((const volatile uint64_t *)(bmap + 8), __ATOMIC_ACQUIRE);
        if (UNLIKELY(g != __atomic_load_n(&cur_gen, __ATOMIC_RELAXED)))
            budget_reload();
    }
}

static void atfork_child(void)
{
    /* The child is a new process: it must not hold (or share) the parent's slot. */
    if (ledger.fd >= 0 || ledger.h)
        tl_forget(&ledger);
    ledger_state = 0;
    pthread_mutex_init(&ledger_mu, NULL);
    pthread_mutex_init(&reload_mu, NULL);
    memset(credit, 0, sizeof credit);
    extern void th_ptrs_reset_child(void);
    th_ptrs_reset_child();
}

static void budget_once_fn(void)
{
    budget_init();
    for (int i = 0; i < MAX_ORD; i++)
        dev_entry[i] = -2;
    pthread_atfork(NULL, NULL, atfork_child);
}

static inline void ensure_budget(void)
{
    pthread_once(&budget_once, budget_once_fn);
}

static struct tl *ledger_get(void)
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
        if (tl_open(&ledger, path, &why) || tl_join(&ledger, &why)) {
            th_log("ledger %s: %s: refusing device memory", path, why);
            tl_forget(&ledger);
            __atomic_store_n(&ledger_state, -1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&ledger_state, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&ledger_mu);
    return ledger_state == 1 ? &ledger : NULL;
}

static __attribute__((noinline)) int entry_of_ordinal_slow(int ord, uint64_t g);

/* Budget entry of a CUDA ordinal: -1 when the budget names no such device. */
static inline int entry_of_ordinal(int ord)
{
    if (UNLIKELY(ord < 0 || ord >= MAX_ORD))
        return -1;
    uint64_t g = __atomic_load_n(&cur_gen, __ATOMIC_ACQUIRE);
    if (LIKELY(g == __atomic_load_n(&dev_entry_gen, __ATOMIC_RELAXED))) {
        int e = __atomic_load_n(&dev_entry[ord], __ATOMIC_RELAXED);
        if (LIKELY(e != -2))
            return e;
    }
    return entry_of_ordinal_slow(ord, g);
}

static __attribute__((noinline)) int entry_of_ordinal_slow(int ord, uint64_t g)
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
enum { K_PTR = 1, K_HANDLE, K_ARRAY, K_MIPMAP, K_GEXEC };
struct rec {
    uint64_t key;
    uint64_t bytes;
    int32_t entry;
    uint8_t kind; /* 0 empty, 0xff tombstone */
};
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

HIDDEN void th_ptrs_reset_child(void);
HIDDEN void th_ptrs_reset_child(void)
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

static int rec_put(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    recs_lock();
    if ((recs_used + 1) * 2 > recs_cap && recs_grow_locked()) {
        recs_unlock();
        return -1;
    }
    size_t j = rhash(key, kind) & (recs_cap - 1), tomb = SIZE_MAX;
    while (recs[j].kind) {
        if (recs[j].kind == kind && recs[j].key == key)
            break;
        if (recs[j].kind == 0xff && tomb == SIZE_MAX)
            tomb = j;
        j = (j + 1) & (recs_cap - 1);
    }
    if (!recs[j].kind) {
        if (tomb != SIZE_MAX)
            j = tomb;
        else
            recs_used++;
    }
    recs[j] = (struct rec){key, bytes, entry, kind};
    recs_unlock();
    return 0;
}

/* Find (and when take != 0, remove) a record.  1 found. */
static int rec_get(uint8_t kind, uint64_t key, int take, struct rec *out)
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
 * Memory: reserve -> driver -> record (or release on failure).
 * ==================================================================================== */
static __thread int in_hook __attribute__((tls_model("initial-exec")));

static int cu_ready;
static __attribute__((noinline)) void cu_ready_slow(void)
{
    pthread_once(&cu_once, cu_init);
    ensure_budget();
    __atomic_store_n(&cu_ready, 1, __ATOMIC_RELEASE);
}
#define CU_READY()                                              \
    do {                                                        \
        if (UNLIKELY(!__atomic_load_n(&cu_ready, __ATOMIC_ACQUIRE))) \
            cu_ready_slow();                                    \
    } while (0)

#define REAL_OR_FAIL(name)                              \
    do {                                                \
        if (UNLIKELY(!REAL(name)))                      \
            return CUDA_ERROR_NOT_SUPPORTED;            \
    } while (0)

static int ndevices = -1;
static inline int one_device(void)
{
    int n = __atomic_load_n(&ndevices, __ATOMIC_RELAXED);
    if (UNLIKELY(n < 0)) {
        int c = 0;
        if (!r_cuDeviceGetCount || r_cuDeviceGetCount(&c) != CUDA_SUCCESS)
            return 0; /* not initialised yet: ask every time */
        __atomic_store_n(&ndevices, c, __ATOMIC_RELAXED);
        n = c;
    }
    return n == 1;
}

/* Reserve bytes for the device of the current context (ord < 0) or ordinal ord.
 * CUDA_SUCCESS with *entry set (-1: untracked, pass through), or the error to return. */
static inline __attribute__((always_inline)) CUresult reserve(int ord, uint64_t bytes, int *entry)
{
    *entry = -1;
    if (mode == MODE_OFF || in_hook)
        return CUDA_SUCCESS;
    if (ord < 0) {
        /* One visible device: it is the current context's device (without a context the
         * driver call fails and the reservation is given back). */
        if (one_device()) {
            ord = 0;
        } else {
            CUdevice d;
            if (!r_cuCtxGetDevice || r_cuCtxGetDevice(&d) != CUDA_SUCCESS)
                return CUDA_ERROR_INVALID_CONTEXT;
            ord = d;
        }
    }
    budget_check();
    int e = entry_of_ordinal(ord);
    if (e < 0) {
        LOG_ONCE("device %d is not in the budget: refusing its memory", ord);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint32_t f = __atomic_load_n(&cur_flags[e], __ATOMIC_RELAXED);
    uint64_t limit = (f & TB_DEV_MEM_LIMIT) ? __atomic_load_n(&cur_limit[e], __ATOMIC_RELAXED)
                                            : UINT64_MAX;
    struct tl *l = ledger_get();
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int r = tl_reserve(l, e, bytes, limit);
    if (r == 1 && tl_reap(l) > 0)
        r = tl_reserve(l, e, bytes, limit);
    if (r != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *entry = e;
    return CUDA_SUCCESS;
}

static void unreserve(int entry, uint64_t bytes)
{
    if (entry >= 0 && bytes && ledger_state == 1)
        tl_release(&ledger, entry, bytes);
}

/* After a successful driver call: remember what it holds; on failure undo everything. */
static int remember(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    if (entry < 0)
        return 0;
    if (rec_put(kind, key, entry, bytes)) {
        unreserve(entry, bytes);
        return -1;
    }
    return 0;
}

static void forget(uint8_t kind, uint64_t key)
{
    struct rec r;
    if (rec_get(kind, key, 1, &r))
        unreserve(r.entry, r.bytes);
}

#define ENTER() (in_hook++)
#define LEAVE() (in_hook--)

/* The one counted-allocation step every path shares: reserve the bytes, call the driver,
 * give them back if it fails, then remember the object so that its free returns them.  If
 * the table of live objects is full, the object goes back to the driver and the caller sees
 * OUT_OF_MEMORY: nothing is ever held uncounted.  `arg` is the path's argument struct. */
struct counted {
    uint8_t kind;
    CUresult (*call)(void *arg);  /* the driver call that creates the object */
    uint64_t (*key)(void *arg);   /* the created object's key (read after success) */
    void (*undo)(void *arg);      /* destroy the created object */
};

static inline __attribute__((always_inline)) CUresult
counted_alloc(const struct counted *c, void *arg, int ord, uint64_t bytes)
{
    int e;
    CUresult r = reserve(ord, bytes, &e);
    if (r != CUDA_SUCCESS)
        return r;
    ENTER();
    r = c->call(arg);
    LEAVE();
    if (r != CUDA_SUCCESS) {
        unreserve(e, bytes);
        return r;
    }
    if (remember(c->kind, c->key(arg), e, bytes)) {
        c->undo(arg);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* Device-pointer paths: every argument struct starts with the CUdeviceptr * it fills. */
static uint64_t key_ptr(void *a) { return (uint64_t)**(CUdeviceptr **)a; }
static void undo_ptr(void *a) { REAL(cuMemFree_v2)(**(CUdeviceptr **)a); }

struct a_alloc { CUdeviceptr *p; size_t n; };
static CUresult call_alloc(void *a_) { struct a_alloc *a = a_; return REAL(cuMemAlloc_v2)(a->p, a->n); }
static const struct counted PATH_ALLOC = {K_PTR, call_alloc, key_ptr, undo_ptr};
EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAlloc_v2);
    if (!dptr)
        return REAL(cuMemAlloc_v2)(dptr, bytesize);
    struct a_alloc a = {dptr, bytesize};
    return counted_alloc(&PATH_ALLOC, &a, -1, bytesize);
}

struct a_managed { CUdeviceptr *p; size_t n; unsigned int f; };
static CUresult call_managed(void *a_) { struct a_managed *a = a_; return REAL(cuMemAllocManaged)(a->p, a->n, a->f); }
static const struct counted PATH_MANAGED = {K_PTR, call_managed, key_ptr, undo_ptr};
EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocManaged);
    if (!dptr)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    struct a_managed a = {dptr, bytesize, flags};
    return counted_alloc(&PATH_MANAGED, &a, -1, bytesize);
}

struct a_async {
    CUdeviceptr *p;
    size_t n;
    CUstream s;
    CUmemoryPool pool;
    CUresult (*free)(CUdeviceptr, CUstream);  /* the matching (per-thread or not) async free */
};
static void undo_async(void *a_)
{
    struct a_async *a = a_;
    if (a->free)
        a->free(*a->p, a->s);
}
static CUresult call_async(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocAsync)(a->p, a->n, a->s); }
static CUresult call_async_ptsz(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocAsync_ptsz)(a->p, a->n, a->s); }
static CUresult call_pool(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocFromPoolAsync)(a->p, a->n, a->pool, a->s); }
static CUresult call_pool_ptsz(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocFromPoolAsync_ptsz)(a->p, a->n, a->pool, a->s); }
static const struct counted PATH_ASYNC = {K_PTR, call_async, key_ptr, undo_async};
static const struct counted PATH_ASYNC_PTSZ = {K_PTR, call_async_ptsz, key_ptr, undo_async};
static const struct counted PATH_POOL = {K_PTR, call_pool, key_ptr, undo_async};
static const struct counted PATH_POOL_PTSZ = {K_PTR, call_pool_ptsz, key_ptr, undo_async};

EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocAsync);
    if (!dptr)
        return REAL(cuMemAllocAsync)(dptr, n, s);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync)};
    return counted_alloc(&PATH_ASYNC, &a, -1, n);
}
EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocAsync_ptsz);
    if (!dptr)
        return REAL(cuMemAllocAsync_ptsz)(dptr, n, s);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync_ptsz)};
    return counted_alloc(&PATH_ASYNC_PTSZ, &a, -1, n);
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync);
    if (!dptr)
        return REAL(cuMemAllocFromPoolAsync)(dptr, n, pool, s);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync)};
    return counted_alloc(&PATH_POOL, &a, -1, n);
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync_ptsz);
    if (!dptr)
        return REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, n, pool, s);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync_ptsz)};
    return counted_alloc(&PATH_POOL_PTSZ, &a, -1, n);
}

EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                          unsigned int esz)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    if (!dptr || !pitch)
        return REAL(cuMemAllocPitch_v2)(dptr, pitch, w, h, esz);
    /* Reserve an upper estimate (rows padded to 512 bytes), settle on pitch * height. */
    uint64_t row = w > UINT64_MAX - 511 ? UINT64_MAX : ((uint64_t)w + 511) & ~(uint64_t)511;
    uint64_t est = (h && row > UINT64_MAX / h) ? UINT64_MAX : row * (h ? h : 1);
    int e;
    CUresult r = reserve(-1, est, &e);
    if (r != CUDA_SUCCESS)
        return r;
    ENTER();
    r = REAL(cuMemAllocPitch_v2)(dptr, pitch, w, h, esz);
    LEAVE();
    if (r != CUDA_SUCCESS) {
        unreserve(e, est);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * (h ? h : 1);
    if (e >= 0 && actual > est) {
        int e2;
        if (reserve(-1, actual - est, &e2) != CUDA_SUCCESS) {
            REAL(cuMemFree_v2)(*dptr);
            unreserve(e, est);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (e >= 0 && actual < est) {
        unreserve(e, est - actual);
    }
    if (remember(K_PTR, (uint64_t)*dptr, e, e >= 0 ? actual : 0)) {
        REAL(cuMemFree_v2)(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    CU_READY();
    REAL_OR_FAIL(cuMemFree_v2);
    ENTER();
    CUresult r = REAL(cuMemFree_v2)(dptr);
    LEAVE();
    if (r == CUDA_SUCCESS && dptr)
        forget(K_PTR, dptr);
    return r;
}

static CUresult free_async(CUresult (*fn)(CUdeviceptr, CUstream), CUdeviceptr dptr, CUstream s)
{
    ENTER();
    CUresult r = fn(dptr, s);
    LEAVE();
    if (r == CUDA_SUCCESS && dptr)
        forget(K_PTR, dptr);
    return r;
}
EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemFreeAsync);
    return free_async(REAL(cuMemFreeAsync), dptr, s);
}
EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemFreeAsync_ptsz);
    return free_async(REAL(cuMemFreeAsync_ptsz), dptr, s);
}

struct a_create {
    CUmemGenericAllocationHandle *h;
    size_t n;
    const CUmemAllocationProp *prop;
    unsigned long long flags;
};
static CUresult call_create(void *a_) { struct a_create *a = a_; return REAL(cuMemCreate)(a->h, a->n, a->prop, a->flags); }
static uint64_t key_create(void *a_) { return *((struct a_create *)a_)->h; }
static void undo_create(void *a_)
{
    if (REAL(cuMemRelease))
        REAL(cuMemRelease)(*((struct a_create *)a_)->h);
}
static const struct counted PATH_CREATE = {K_HANDLE, call_create, key_create, undo_create};

EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                   const CUmemAllocationProp *prop, unsigned long long flags)
{
    CU_READY();
    REAL_OR_FAIL(cuMemCreate);
    if (!handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    struct a_create a = {handle, size, prop, flags};
    return counted_alloc(&PATH_CREATE, &a, prop->location.id, size);
}

EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CU_READY();
    REAL_OR_FAIL(cuMemRelease);
    ENTER();
    CUresult r = REAL(cuMemRelease)(handle);
    LEAVE();
    if (r == CUDA_SUCCESS)
        forget(K_HANDLE, handle);
    return r;
}

/* Bytes of an array: width x height x depth x element size, per mip level.  Saturates. */
static uint64_t fmt_bytes(CUarray_format f)
{
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 16; /* unknown: assume the widest element */
    }
}
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return (a && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}
static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned levels)
{
    uint64_t elem = mul_sat(fmt_bytes(f), ch ? ch : 1), total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        total = add_sat(total, mul_sat(mul_sat(mul_sat(lw, lh), ld), elem));
    }
    return total;
}

struct a_arr { CUarray *a; const void *d; unsigned lv; CUmipmappedArray *m; };
static CUresult call_arr(void *x) { struct a_arr *a = x; return REAL(cuArrayCreate_v2)(a->a, a->d); }
static CUresult call_arr3(void *x) { struct a_arr *a = x; return REAL(cuArray3DCreate_v2)(a->a, a->d); }
static CUresult call_mip(void *x) { struct a_arr *a = x; return REAL(cuMipmappedArrayCreate)(a->m, a->d, a->lv); }
static uint64_t key_arr(void *x) { return (uint64_t)(uintptr_t)*((struct a_arr *)x)->a; }
static uint64_t key_mip(void *x) { return (uint64_t)(uintptr_t)*((struct a_arr *)x)->m; }
static void undo_arr(void *x)
{
    if (REAL(cuArrayDestroy))
        REAL(cuArrayDestroy)(*((struct a_arr *)x)->a);
}
static void undo_mip(void *x)
{
    if (REAL(cuMipmappedArrayDestroy))
        REAL(cuMipmappedArrayDestroy)(*((struct a_arr *)x)->m);
}
static const struct counted PATH_ARRAY = {K_ARRAY, call_arr, key_arr, undo_arr};
static const struct counted PATH_ARRAY3D = {K_ARRAY, call_arr3, key_arr, undo_arr};
static const struct counted PATH_MIPMAP = {K_MIPMAP, call_mip, key_mip, undo_mip};

EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CU_READY();
    REAL_OR_FAIL(cuArrayCreate_v2);
    if (!arr || !d)
        return REAL(cuArrayCreate_v2)(arr, d);
    struct a_arr a = {arr, d, 0, NULL};
    uint64_t b = array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 1);
    return counted_alloc(&PATH_ARRAY, &a, -1, b);
}

EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CU_READY();
    REAL_OR_FAIL(cuArray3DCreate_v2);
    if (!arr || !d)
        return REAL(cuArray3DCreate_v2)(arr, d);
    struct a_arr a = {arr, d, 0, NULL};
    uint64_t b = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1);
    return counted_alloc(&PATH_ARRAY3D, &a, -1, b);
}

EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                              unsigned int levels)
{
    CU_READY();
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    if (!m || !d)
        return REAL(cuMipmappedArrayCreate)(m, d, levels);
    struct a_arr a = {NULL, d, levels, m};
    uint64_t b = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, levels);
    return counted_alloc(&PATH_MIPMAP, &a, -1, b);
}

EXPORT CUresult CUDAAPI cuArrayDestroy(CUarray arr)
{
    CU_READY();
    REAL_OR_FAIL(cuArrayDestroy);
    ENTER();
    CUresult r = REAL(cuArrayDestroy)(arr);
    LEAVE();
    if (r == CUDA_SUCCESS)
        forget(K_ARRAY, (uint64_t)(uintptr_t)arr);
    return r;
}

EXPORT CUresult CUDAAPI cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    CU_READY();
    REAL_OR_FAIL(cuMipmappedArrayDestroy);
    ENTER();
    CUresult r = REAL(cuMipmappedArrayDestroy)(m);
    LEAVE();
    if (r == CUDA_SUCCESS)
        forget(K_MIPMAP, (uint64_t)(uintptr_t)m);
    return r;
}

/* Legacy 32-bit (v1) entry points: refused, so they cannot be used to go around the count. */
#define LEGACY_REFUSE(name)                                                                \
    do {                                                                                   \
        LOG_ONCE("legacy %s refused (use the _v2 API)", #name);                            \
        return CUDA_ERROR_NOT_SUPPORTED;                                                   \
    } while (0)
EXPORT CUresult CUDAAPI cuMemAlloc(unsigned int *d, unsigned int n) { (void)d; (void)n; LEGACY_REFUSE(cuMemAlloc); }
EXPORT CUresult CUDAAPI cuMemAllocPitch(unsigned int *d, unsigned int *p, unsigned int w, unsigned int h, unsigned int e)
{ (void)d; (void)p; (void)w; (void)h; (void)e; LEGACY_REFUSE(cuMemAllocPitch); }
EXPORT CUresult CUDAAPI cuMemFree(unsigned int d) { (void)d; LEGACY_REFUSE(cuMemFree); }
EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int *f, unsigned int *t) { (void)f; (void)t; LEGACY_REFUSE(cuMemGetInfo); }
EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int *b, CUdevice d) { (void)b; (void)d; LEGACY_REFUSE(cuDeviceTotalMem); }
EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *a, const void *d) { (void)a; (void)d; LEGACY_REFUSE(cuArrayCreate); }
EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *a, const void *d) { (void)a; (void)d; LEGACY_REFUSE(cuArray3DCreate); }

/* ---- views: the budget is the device's total, the container's use is what is used ---- */
static int view(int e, uint64_t phys_total, uint64_t *total, uint64_t *used)
{
    if (e < 0)
        return 0;
    budget_check();
    uint32_t f = __atomic_load_n(&cur_flags[e], __ATOMIC_RELAXED);
    uint64_t lim = (f & TB_DEV_MEM_LIMIT) ? __atomic_load_n(&cur_limit[e], __ATOMIC_RELAXED) : phys_total;
    *total = lim < phys_total ? lim : phys_total;
    struct tl *l = ledger_get();
    uint64_t u = l ? __atomic_load_n(&l->h->dev[e].used, __ATOMIC_RELAXED) : 0;
    *used = u < *total ? u : *total;
    return 1;
}

EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    CU_READY();
    REAL_OR_FAIL(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult r = REAL(cuMemGetInfo_v2)(&f, &t);
    if (r != CUDA_SUCCESS || mode == MODE_OFF) {
        if (r == CUDA_SUCCESS) {
            if (free_) *free_ = f;
            if (total) *total = t;
        }
        return r;
    }
    CUdevice d;
    uint64_t vt, vu;
    if (r_cuCtxGetDevice && r_cuCtxGetDevice(&d) == CUDA_SUCCESS) {
        budget_check();
        if (view(entry_of_ordinal(d), t, &vt, &vu)) {
            uint64_t vf = vt - vu;
            t = (size_t)vt;
            f = vf < f ? (size_t)vf : f;
        } else {
            t = 0;
            f = 0;
        }
    }
    if (free_) *free_ = f;
    if (total) *total = t;
    return r;
}

EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    size_t t = 0;
    CUresult r = REAL(cuDeviceTotalMem_v2)(&t, dev);
    if (r == CUDA_SUCCESS && mode != MODE_OFF) {
        uint64_t vt, vu;
        budget_check();
        t = view(entry_of_ordinal(dev), t, &vt, &vu) ? (size_t)vt : 0;
    }
    if (r == CUDA_SUCCESS && bytes)
        *bytes = t;
    return r;
}

/* ====================================================================================
 * Cores: launches spend tokens (1 per kernel) from the container's bucket.
 * Fast path: a relaxed decrement of a process-local credit.  Slow path: take a batch from
 * the shared GCRA bucket (one CAS on tat_ns) and sleep until it conforms.
 * ==================================================================================== */
static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static __attribute__((noinline)) void refill(int e, uint64_t cost)
{
    struct tl *l = ledger_get();
    uint64_t t0 = 0;
    for (;;) {
        budget_check();
        uint32_t f = __atomic_load_n(&cur_flags[e], __ATOMIC_RELAXED);
        if (!(f & TB_DEV_CORE_LIMIT) || !l) {
            __atomic_fetch_add(&credit[e], (int64_t)cost, __ATOMIC_RELAXED);
            return;
        }
        uint64_t rate = __atomic_load_n(&cur_rate[e], __ATOMIC_RELAXED);
        uint64_t burst = __atomic_load_n(&cur_burst[e], __ATOMIC_RELAXED);
        if (rate == 0) { /* the controller paused this container: re-check every 10 ms */
            if (!t0)
                t0 = mono_ns();
            sleep_ns(10000000);
            continue;
        }
        /* batch: ~1 ms worth of tokens, at least the cost of this launch */
        uint64_t batch = rate / 1000;
        uint64_t need = cost + (batch > 1000 ? batch - 1000 : 0);
        uint64_t need_ns = (uint64_t)((double)need * 1e9 / (double)rate);
        uint64_t burst_ns = (uint64_t)((double)burst * 1e9 / (double)rate);
        struct tl_dev *d = &l->h->dev[e];
        uint64_t now = mono_ns(), tat = __atomic_load_n(&d->tat_ns, __ATOMIC_RELAXED), ntat;
        do {
            ntat = (tat > now ? tat : now) + need_ns;
        } while (!__atomic_compare_exchange_n(&d->tat_ns, &tat, ntat, 1, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED));
        __atomic_fetch_add(&d->tokens_milli, need, __ATOMIC_RELAXED);
        uint64_t go = ntat > burst_ns ? ntat - burst_ns : 0;
        if (go > now) {
            if (!t0)
                t0 = now;
            /* sleep in slices so a budget change is noticed */
            while (go > now) {
                uint64_t s = go - now;
                sleep_ns(s > 20000000 ? 20000000 : s);
                now = mono_ns();
            }
        }
        if (t0) {
            uint64_t w = mono_ns() - t0;
            __atomic_fetch_add(&d->wait_ns, w, __ATOMIC_RELAXED);
            __atomic_fetch_add(&d->waits, 1, __ATOMIC_RELAXED);
            uint64_t us = w / 1000;
            int b = us ? 64 - __builtin_clzll(us) : 0;
            __atomic_fetch_add(&l->h->wait_hist[e][b > 31 ? 31 : b], 1, __ATOMIC_RELAXED);
            if (l->self)
                l->self->wait_ns += w;
        }
        __atomic_fetch_add(&credit[e], (int64_t)need, __ATOMIC_RELAXED);
        return;
    }
}

static int entry_of_ordinal(int ord);
static int launch_entry_multi(void)
{
    CUdevice d;
    if (!r_cuCtxGetDevice || r_cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return 0;
    int e = entry_of_ordinal(d);
    return e < 0 ? 0 : e;
}

/* Spend `kernels` tokens before a launch; waits when the bucket is empty. */
static inline void spend(uint64_t kernels)
{
    if (mode == MODE_OFF)
        return;
    budget_check();
    int e = cur_ndev == 1 ? 0 : one_device() ? entry_of_ordinal(0) : launch_entry_multi();
    if (e < 0)
        return; /* a device outside the budget has no memory to run anything with */
    if (!(__atomic_load_n(&cur_flags[e], __ATOMIC_RELAXED) & TB_DEV_CORE_LIMIT))
        return;
    int64_t cost = (int64_t)kernels * 1000;
    if (UNLIKELY(__atomic_sub_fetch(&credit[e], cost, __ATOMIC_RELAXED) < 0))
        refill(e, (uint64_t)cost);
}

EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                      CUstream s, void **params, void **extra)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchKernel);
    spend(1);
    return REAL(cuLaunchKernel)(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}
EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                           unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                           CUstream s, void **params, void **extra)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchKernel_ptsz);
    spend(1);
    return REAL(cuLaunchKernel_ptsz)(f, gx, gy, gz, bx, by, bz, sh, s, params, extra);
}
EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **x)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchKernelEx);
    spend(1);
    return REAL(cuLaunchKernelEx)(c, f, p, x);
}
EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **x)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchKernelEx_ptsz);
    spend(1);
    return REAL(cuLaunchKernelEx_ptsz)(c, f, p, x);
}
EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                 unsigned bx, unsigned by, unsigned bz, unsigned sh,
                                                 CUstream s, void **params)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchCooperativeKernel);
    spend(1);
    return REAL(cuLaunchCooperativeKernel)(f, gx, gy, gz, bx, by, bz, sh, s, params);
}
EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                      unsigned gz, unsigned bx, unsigned by,
                                                      unsigned bz, unsigned sh, CUstream s,
                                                      void **params)
{
    CU_READY();
    REAL_OR_FAIL(cuLaunchCooperativeKernel_ptsz);
    spend(1);
    return REAL(cuLaunchCooperativeKernel_ptsz)(f, gx, gy, gz, bx, by, bz, sh, s, params);
}

/* A graph costs what its kernels cost: counted once, at instantiation. */
static uint64_t graph_kernels(CUgraph g, int depth)
{
    size_t n = 0;
    if (!g || depth > 8 || !r_cuGraphGetNodes || !r_cuGraphNodeGetType ||
        r_cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0 || n > (1u << 20))
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return 0;
    uint64_t k = 0;
    if (r_cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType t;
            if (r_cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
                continue;
            if (t == CU_GRAPH_NODE_TYPE_KERNEL)
                k++;
            else if (t == CU_GRAPH_NODE_TYPE_GRAPH && r_cuGraphChildGraphNodeGetGraph) {
                CUgraph c;
                if (r_cuGraphChildGraphNodeGetGraph(nodes[i], &c) == CUDA_SUCCESS)
                    k += graph_kernels(c, depth + 1);
            }
        }
    }
    free(nodes);
    return k;
}

EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *ex, CUgraph g, unsigned long long fl)
{
    CU_READY();
    REAL_OR_FAIL(cuGraphInstantiateWithFlags);
    CUresult r = REAL(cuGraphInstantiateWithFlags)(ex, g, fl);
    if (r == CUDA_SUCCESS && ex && mode != MODE_OFF) {
        uint64_t k = graph_kernels(g, 0);
        rec_put(K_GEXEC, (uint64_t)(uintptr_t)*ex, -1, k ? k : 1);
    }
    return r;
}

EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec ex)
{
    CU_READY();
    REAL_OR_FAIL(cuGraphExecDestroy);
    CUresult r = REAL(cuGraphExecDestroy)(ex);
    struct rec rc;
    if (r == CUDA_SUCCESS)
        rec_get(K_GEXEC, (uint64_t)(uintptr_t)ex, 1, &rc);
    return r;
}

static uint64_t graph_cost(CUgraphExec ex)
{
    struct rec rc;
    if (mode == MODE_OFF)
        return 1;
    return rec_get(K_GEXEC, (uint64_t)(uintptr_t)ex, 0, &rc) ? rc.bytes : 1;
}

EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec ex, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuGraphLaunch);
    spend(graph_cost(ex));
    return REAL(cuGraphLaunch)(ex, s);
}
EXPORT CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec ex, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuGraphLaunch_ptsz);
    spend(graph_cost(ex));
    return REAL(cuGraphLaunch_ptsz)(ex, s);
}

/* Graph memory nodes: the driver maps their memory at launch, from a per-device graph pool
 * that nothing here sees, so none of it would be counted.  While a budget is in force they
 * are refused, as the legacy entry points are; graphs without memory nodes pass through. */
#define GRAPHMEM_REFUSE(what)                                                              \
    do {                                                                                   \
        LOG_ONCE("%s refused: graph memory nodes are not counted against the budget "      \
                 "(use cuMemAllocAsync/cuMemFreeAsync outside the graph)", what);           \
        return CUDA_ERROR_NOT_SUPPORTED;                                                   \
    } while (0)

EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                              size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    CU_READY();
    if (mode != MODE_OFF)
        GRAPHMEM_REFUSE("cuGraphAddMemAllocNode");
    REAL_OR_FAIL(cuGraphAddMemAllocNode);
    return REAL(cuGraphAddMemAllocNode)(n, g, deps, ndeps, p);
}

EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                      size_t ndeps, CUgraphNodeParams *p)
{
    CU_READY();
    if (mode != MODE_OFF && p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        GRAPHMEM_REFUSE("cuGraphAddNode(CU_GRAPH_NODE_TYPE_MEM_ALLOC)");
    REAL_OR_FAIL(cuGraphAddNode);
    return REAL(cuGraphAddNode)(n, g, deps, ndeps, p);
}

EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                         const CUgraphEdgeData *edges, size_t ndeps,
                                         CUgraphNodeParams *p)
{
    CU_READY();
    if (mode != MODE_OFF && p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        GRAPHMEM_REFUSE("cuGraphAddNode_v2(CU_GRAPH_NODE_TYPE_MEM_ALLOC)");
    REAL_OR_FAIL(cuGraphAddNode_v2);
    return REAL(cuGraphAddNode_v2)(n, g, deps, edges, ndeps, p);
}

/* ====================================================================================
 * Lookup paths: cuGetProcAddress, dlsym, dlvsym, dlmopen.
 * ==================================================================================== */
NOSAN static int find_name(const char *name)
{
    if (!name || (name[0] != 'c' && name[0] != 'n'))
        return -1;
    for (int i = 0; i < IDX_COUNT; i++)
        if (s_eq(th_table[i].name, name))
            return i;
    return -1;
}

static int base_guarded(const char *sym)
{
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_CU && !strcmp(th_table[i].base, sym))
            return 1;
    return 0;
}

/* Map what the driver handed out for (symbol, version, flags) to our hook. */
static void *proc_filter(const char *symbol, void *got, int ver, cuuint64_t flags)
{
    if (!got || !symbol)
        return got;
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_CU && real_ptr[i] == got)
            return th_table[i].hook;
    if (!base_guarded(symbol))
        return got;
    int want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    for (int pass = 0; pass < 2; pass++, want = 0) {
        int best = -1;
        for (int i = 0; i < IDX_COUNT; i++) {
            const struct th_entry *t = &th_table[i];
            if (t->lib == LIB_CU && t->ptsz == want && !strcmp(t->base, symbol) &&
                t->min_version <= ver && real_ptr[i] &&
                (best < 0 || t->min_version > th_table[best].min_version))
                best = i;
        }
        if (best >= 0)
            return th_table[best].hook;
    }
    return NULL;
}

EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int ver,
                                           cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    CU_READY();
    REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, ver, flags, st);
    if (r == CUDA_SUCCESS && pfn && *pfn) {
        void *h = proc_filter(symbol, *pfn, ver, flags);
        if (!h) {
            LOG_ONCE("cuGetProcAddress(%s, %d): no counted variant; refused", symbol, ver);
            *pfn = NULL;
            if (st)
                *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = h;
    }
    return r;
}

EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    CU_READY();
    REAL_OR_FAIL(cuGetProcAddress);
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) {
        void *h = proc_filter(symbol, *pfn, ver, flags);
        if (!h) {
            LOG_ONCE("cuGetProcAddress(%s, %d): no counted variant; refused", symbol, ver);
            *pfn = NULL;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = h;
    }
    return r;
}

EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags);

/* Our answer for a looked-up name, or NULL to let glibc answer. */
static void *hook_for(int i);
NOSAN static void *lookup_hook(const char *name)
{
    if (!name)
        return NULL;
    if (name[0] == 'd' && name[1] == 'l') {
        extern void *dlsym(void *, const char *);
        extern void *dlvsym(void *, const char *, const char *);
        if (s_eq(name, "dlsym"))
            return (void *)&dlsym;
        if (s_eq(name, "dlvsym"))
            return (void *)&dlvsym;
        if (s_eq(name, "dlmopen"))
            return (void *)&dlmopen;
        return NULL;
    }
    int i = find_name(name);
    if (i < 0)
        return NULL;
    return hook_for(i);
}

static void *hook_for(int i)
{
    if (th_table[i].lib == LIB_CU)
        pthread_once(&cu_once, cu_init);
    else
        pthread_once(&nvml_once, nvml_init);
    return real_ptr[i] ? th_table[i].hook : NULL;
}

NOSAN static int maybe_ours(const char *name)
{
    return name && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v') ||
                    (name[0] == 'd' && name[1] == 'l'));
}

HIDDEN void *tessera_dlsym_filter(void *handle, const char *name);
NOSAN HIDDEN void *tessera_dlsym_filter(void *handle, const char *name)
{
    (void)handle;
    libc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version);
NOSAN HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version)
{
    (void)handle;
    (void)version;
    libc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

/* A library loaded into a new link-map namespace would reach the driver without us: when
 * the namespace contains libcuda or libnvidia-ml, load it into the base namespace instead. */
EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags)
{
    pthread_once(&libc_once, libc_init);
    if (!real_dlmopen)
        return NULL;
    if (lmid != LM_ID_BASE && file &&
        (strstr(file, "libcuda.so") || strstr(file, "libnvidia-ml.so"))) {
        LOG_ONCE("dlmopen of %s into a new namespace: using the base namespace", file);
        return dlopen(file, flags);
    }
    void *h = real_dlmopen(lmid, file, flags);
    if (!h || lmid == LM_ID_BASE)
        return h;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) || !lm)
        return h;
    while (lm->l_prev)
        lm = lm->l_prev;
    int gpu = 0;
    for (; lm; lm = lm->l_next)
        if (lm->l_name && (strstr(lm->l_name, "libcuda.so") || strstr(lm->l_name, "libnvidia-ml.so")))
            gpu = 1;
    if (!gpu)
        return h;
    LOG_ONCE("dlmopen of %s into a new namespace loads the GPU driver: using the base namespace",
             file ? file : "(main)");
    dlclose(h);
    return dlopen(file, flags);
}

/* ====================================================================================
 * NVML
 * ==================================================================================== */
static int nvml_entry(nvmlDevice_t dev)
{
    budget_check();
    char buf[96];
    uint8_t u[16];
    int have = r_nvmlDeviceGetUUID && r_nvmlDeviceGetUUID(dev, buf, sizeof buf) == NVML_SUCCESS &&
               tb_uuid_parse(buf, u) == 0;
    unsigned idx = 0;
    int have_idx = r_nvmlDeviceGetIndex && r_nvmlDeviceGetIndex(dev, &idx) == NVML_SUCCESS;
    for (uint32_t i = 0; i < cur_ndev && i < TB_MAX_DEV; i++) {
        uint32_t f = __atomic_load_n(&cur_flags[i], __ATOMIC_RELAXED);
        if ((f & TB_DEV_UUID) ? (have && !memcmp(u, cur_uuid[i], 16))
                              : (have_idx && cur_index[i] == idx))
            return (int)i;
    }
    return -1;
}

#define NVML_READY()                                \
    do {                                            \
        pthread_once(&nvml_once, nvml_init);        \
        ensure_budget();                            \
    } while (0)

/* NVML's memory view, v1 and v2 alike: the budget is the total, the container's use is used;
 * a device outside the budget shows nothing. */
static void nvml_view(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_)
{
    uint64_t t, u;
    if (view(nvml_entry(dev), *total, &t, &u)) {
        *total = t;
        *used = u;
        *free_ = t - u;
    } else {
        *total = *used = *free_ = 0;
    }
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
    NVML_READY();
    if (!REAL(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(dev, m);
    if (r == NVML_SUCCESS && m && mode != MODE_OFF)
        nvml_view(dev, &m->total, &m->used, &m->free);
    return r;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
    NVML_READY();
    if (!REAL(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(dev, m);
    if (r == NVML_SUCCESS && m && mode != MODE_OFF) {
        nvml_view(dev, &m->total, &m->used, &m->free);
        m->reserved = 0;
    }
    return r;
}

/* ---- test support: the table, for the test programs (not part of the API) ---- */
EXPORT int tessera_symbol_count(void);
EXPORT int tessera_symbol_count(void) { return IDX_COUNT; }
EXPORT const char *tessera_symbol_name(int i);
EXPORT const char *tessera_symbol_name(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].name : NULL; }
EXPORT void *tessera_symbol_hook(int i);
EXPORT void *tessera_symbol_hook(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].hook : NULL; }
