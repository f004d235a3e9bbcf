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

/* ---- the table (hooks.def) ---- */
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

/* ---- process-local records: what each allocation / handle / array / graph exec holds ---- */
enum { K_PTR = 1, K_HANDLE, K_ARRAY, K_MIPMAP, K_GEXEC };
struct rec {
    uint64_t key;
    uint64_t bytes;
    int32_t entry;
    uint8_t kind; /* 0 empty, 0xff tombstone */
};
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

#pragma GCC visibility pop
#endif
