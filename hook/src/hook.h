/* libtessera internals shared by its source files (hook.c, lookup.c, mem.c, view.c,
 * launch.c).  Not an API: everything here is hidden inside libtessera.so.
 *
 * Rules: the hook never crashes or hangs its host; no lock is held across a call into the
 * driver; the launch fast path takes no lock, makes no system call and reads no
 * environment variable; nothing in the environment matters while a budget file exists.
 */
#ifndef TESSERA_HOOK_H
#define TESSERA_HOOK_H

#define _GNU_SOURCE
#include <cuda.h>
#include <nvml.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

#include "budget.h"
#include "formats.h"
#include "ledger.h"

/* Everything declared below is hidden (as the library is built with -fvisibility=hidden), so
 * the other files reach these globals PC-relative, without a GOT load: the hot paths are as
 * short as in one file.  The hooks themselves are marked EXPORT. */
#pragma GCC visibility push(hidden)

/* cuda.h maps legacy names onto their current versions; we hook both, under their own names. */
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGetProcAddress
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset

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
EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
EXPORT __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
EXPORT __typeof__(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
EXPORT __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
EXPORT __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
EXPORT __typeof__(cuLaunchKernelEx) cuLaunchKernelEx_ptsz;
EXPORT __typeof__(cuLaunchCooperativeKernel) cuLaunchCooperativeKernel_ptsz;
EXPORT __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

/* ---- the table (hooks.def) ---- */
enum th_lib { LIB_CU, LIB_NVML };
enum th_class {
    C_ALLOC, C_FREE, C_CTX, C_CTXFREE, C_POOL, C_INFO, C_LAUNCH, C_LEGACY, C_GRAPH, C_GRAPHMEM, C_PROC
};

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

extern const struct th_entry th_table[IDX_COUNT];
extern void *real_ptr[IDX_COUNT];
#define REAL(name) ((__typeof__(&name))real_ptr[IDX_##name])

/* Driver entry points we call but do not hook. */
extern CUresult (*r_cuCtxGetDevice)(CUdevice *);
extern CUresult (*r_cuDeviceGetCount)(int *);
extern CUresult (*r_cuDeviceGetUuid)(CUuuid *, CUdevice);
extern CUresult (*r_cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
extern CUresult (*r_cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
extern CUresult (*r_cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
extern CUresult (*r_cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
extern CUresult (*r_cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
extern CUresult (*r_cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
extern nvmlReturn_t (*r_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
extern nvmlReturn_t (*r_nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int *);

/* ---- logging: one line per distinct event ---- */
void th_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LOG_ONCE(...)                                                   \
    do {                                                                \
        static int once_;                                               \
        if (!__atomic_exchange_n(&once_, 1, __ATOMIC_RELAXED))          \
            th_log(__VA_ARGS__);                                        \
    } while (0)

/* ---- glibc's dlsym/dlvsym/dlmopen (lookup.c) ---- */
extern pthread_once_t libc_once;
void libc_init(void);
extern void *(*tessera_real_dlsym)(void *, const char *);

/* ---- initialisation, budget source, ledger (hook.c) ---- */
enum { MODE_OFF, MODE_FILE, MODE_ENV };

extern pthread_once_t cu_once, nvml_once, budget_once;
void cu_init(void);
void nvml_init(void);
void budget_once_fn(void);
void budget_reload(void) __attribute__((noinline));

extern int mode;                           /* MODE_* */
extern const volatile unsigned char *bmap; /* budget file mapping (MODE_FILE) */

/* Current budget, per entry.  Fields are read without a lock; each is atomic on its own. */
extern uint64_t cur_gen;                   /* generation the values below reflect */
extern uint32_t cur_ndev;
extern uint32_t cur_flags[TB_MAX_DEV];
extern uint64_t cur_limit[TB_MAX_DEV];
extern uint64_t cur_rate[TB_MAX_DEV];
extern uint64_t cur_burst[TB_MAX_DEV];
extern uint8_t cur_uuid[TB_MAX_DEV][16];
extern uint32_t cur_index[TB_MAX_DEV];

#define MAX_ORD 64
extern int dev_entry[MAX_ORD];             /* CUDA ordinal -> entry, -2 unknown, -1 none */
extern uint64_t dev_entry_gen;

extern struct tl ledger;
extern int ledger_state;                   /* 0 not tried, 1 joined, -1 unusable */
extern uint64_t ledger_want_dev, ledger_want_ino; /* the daemon's ledger (budget file); 0: none */

/* ---- what a container can do to the library's files (guard.c) ---- */
int budget_file_ok(int fd, const char **why); /* the read-only budget file of its size? */
int th_managed(void);                      /* tessera set this container up */
extern int ledger_lost;                    /* a SIGBUS in the ledger's mapping happened */
void guard_ledger(void *base);             /* a SIGBUS in [base, +TL_FILE_SIZE) loses the
                                              ledger instead of the process; NULL: none */
extern int64_t credit[TB_MAX_DEV];         /* process-local tokens (x1000) taken from the bucket */
struct tl *ledger_get(void);

/* Every check: one load and a compare when nothing changed. */
static inline void budget_check(void)
{
    if (mode == MODE_FILE && LIKELY(bmap != NULL)) {
        uint64_t g = __atomic_load_n((const volatile uint64_t *)(bmap + 8), __ATOMIC_ACQUIRE);
        if (UNLIKELY(g != __atomic_load_n(&cur_gen, __ATOMIC_RELAXED)))
            budget_reload();
    }
}

static inline void ensure_budget(void)
{
    pthread_once(&budget_once, budget_once_fn);
}

int entry_of_ordinal_slow(int ord, uint64_t g) __attribute__((noinline));

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

extern int ndevices;
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

/* ---- process-local records: what each allocation / handle / array / context / graph exec
 * holds ---- */
enum { K_PTR = 1, K_APTR, K_HANDLE, K_ARRAY, K_MIPMAP, K_GEXEC, K_CTX, K_PRIMARY };
struct rec {
    uint64_t key;
    uint64_t bytes;
    int32_t entry;
    uint8_t kind;      /* 0 empty, 0xff tombstone */
    uint8_t reserved;
    uint16_t pool;     /* K_APTR (from a tracked memory pool, pool.c): its slot + 1 and, from
                          bit 7, that slot's generation then.  Not set for other kinds */
};
/* Add a record; one with the same kind and key is replaced when `replace`, else kept.
 * 1 added, 0 there already, -1 out of memory. */
int rec_add(const struct rec *r, int replace);
/* Add or replace a record (its `pool` is not set).  0, or -1 out of memory. */
int rec_put(uint8_t kind, uint64_t key, int entry, uint64_t bytes);
/* Find (and when take != 0, remove) a record.  1 found. */
int rec_get(uint8_t kind, uint64_t key, int take, struct rec *out);
void th_ptrs_reset_child(void);

/* ---- every hook starts here ---- */
extern int cu_ready;
void cu_ready_slow(void) __attribute__((noinline));
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

/* ---- counting device memory (mem.c, ctx.c) ---- */
extern __thread int in_hook __attribute__((tls_model("initial-exec")));
#define ENTER() (in_hook++)
#define LEAVE() (in_hook--)
extern uint64_t cur_ctx[TB_MAX_DEV];       /* bytes one context holds, per entry */

/* Memory pools of this process (mem.c): what each keeps reserved after frees is counted. */
uint64_t pools_settle_all(void);           /* re-read every pool from the driver: bytes given back */
void th_pools_reset_child(void);

/* A reservation was refused: reclaim dead processes' slots and this process's trimmed pool
 * reserves, then try once more.  0 reserved, else refused. */
int reserve_retry(struct tl *l, int e, uint64_t bytes, uint64_t limit) __attribute__((noinline));

/* The budget entry of the device of the current context (*ord < 0, then set) or ordinal *ord.
 * CUDA_SUCCESS with *entry set (-1: untracked, pass through), or the error to return. */
static inline __attribute__((always_inline)) CUresult resolve_entry(int *ord, int *entry)
{
    *entry = -1;
    if (mode == MODE_OFF || in_hook)
        return CUDA_SUCCESS;
    if (*ord < 0) {
        /* One visible device: it is the current context's device (without a context the
         * driver call fails and the reservation is given back). */
        if (one_device()) {
            *ord = 0;
        } else {
            CUdevice d;
            if (!r_cuCtxGetDevice || r_cuCtxGetDevice(&d) != CUDA_SUCCESS)
                return CUDA_ERROR_INVALID_CONTEXT;
            *ord = d;
        }
    }
    budget_check();
    int e = entry_of_ordinal(*ord);
    if (e < 0) {
        LOG_ONCE("device %d is not in the budget: refusing its memory", *ord);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *entry = e;
    return CUDA_SUCCESS;
}

/* Reserve bytes on budget entry e (>= 0): check and reservation are one step. */
static inline __attribute__((always_inline)) CUresult reserve_entry(int e, uint64_t bytes)
{
    uint32_t f = __atomic_load_n(&cur_flags[e], __ATOMIC_RELAXED);
    uint64_t limit = (f & TB_DEV_MEM_LIMIT) ? __atomic_load_n(&cur_limit[e], __ATOMIC_RELAXED)
                                            : UINT64_MAX;
    struct tl *l = ledger_get();
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int r = tl_reserve(l, e, bytes, limit);
    if (UNLIKELY(r == 1))
        r = reserve_retry(l, e, bytes, limit);
    if (UNLIKELY(r < 0))
        LOG_ONCE("ledger %s unusable (its counts or header were written from inside the "
                 "container, or its lock is held): refusing device memory", TB_LEDGER_PATH);
    return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Reserve bytes for the device of the current context (ord < 0) or ordinal ord.
 * CUDA_SUCCESS with *entry set (-1: untracked, pass through), or the error to return. */
static inline __attribute__((always_inline)) CUresult reserve(int ord, uint64_t bytes, int *entry)
{
    int e;
    CUresult r = resolve_entry(&ord, &e);
    if (r != CUDA_SUCCESS || e < 0) {
        *entry = -1;
        return r;
    }
    r = reserve_entry(e, bytes);
    *entry = r == CUDA_SUCCESS ? e : -1;
    return r;
}

static inline void unreserve(int entry, uint64_t bytes)
{
    if (entry >= 0 && bytes && ledger_state == 1)
        tl_release(&ledger, entry, bytes);
}

/* After a successful driver call: remember what it holds; on failure undo everything. */
static inline int remember(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    if (entry < 0)
        return 0;
    if (rec_put(kind, key, entry, bytes)) {
        unreserve(entry, bytes);
        return -1;
    }
    return 0;
}

static inline void forget(uint8_t kind, uint64_t key)
{
    struct rec r;
    if (rec_get(kind, key, 1, &r))
        unreserve(r.entry, r.bytes);
}

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

/* The driver call and what follows it, with `bytes` already reserved on entry e (-1: none). */
static inline __attribute__((always_inline)) CUresult
counted_call(const struct counted *c, void *arg, int e, uint64_t bytes)
{
    CUresult r;
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

static inline __attribute__((always_inline)) CUresult
counted_alloc(const struct counted *c, void *arg, int ord, uint64_t bytes)
{
    int e;
    CUresult r = reserve(ord, bytes, &e);
    if (r != CUDA_SUCCESS)
        return r;
    return counted_call(c, arg, e, bytes);
}

/* Device-pointer paths: every argument struct starts with the CUdeviceptr * it fills. */
static inline uint64_t key_ptr(void *a) { return (uint64_t)**(CUdeviceptr **)a; }

/* Legacy 32-bit (v1) entry points: refused, so they cannot be used to go around the count. */
#define LEGACY_REFUSE(name)                                                                \
    do {                                                                                   \
        LOG_ONCE("legacy %s refused (use the _v2 API)", #name);                            \
        return CUDA_ERROR_NOT_SUPPORTED;                                                   \
    } while (0)

#pragma GCC visibility pop
#endif
