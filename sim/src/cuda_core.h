/* The fake CUDA driver's internals, shared by its files (cuda_*.c): the objects it hands out,
 * one process's driver state (devices, the current-context stack, handle registries, the
 * allocations), and the helpers every entry point uses.  Not an API: hidden inside
 * libcuda.so.1.
 *
 * Locking: g_mu guards this process's state; the node's shared state (simstate.h) has its own
 * lock (sim_lock), taken inside g_mu where both are needed, never the other way round. */
#ifndef TESSERA_SIM_CUDA_CORE_H
#define TESSERA_SIM_CUDA_CORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define CUDA_ENABLE_DEPRECATED 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "simstate.h"

#define EXPORT __attribute__((visibility("default")))

/* Entry points the driver exports under an older ABI's name (cuda_procs.h hands them out). */
CUresult sim_cuGetProcAddress_v1(const char *sym, void **pfn, int ver, cuuint64_t flags) __asm__("cuGetProcAddress");
CUresult sim_cuGraphAddKernelNode_v1(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS_v1 *p) __asm__("cuGraphAddKernelNode");
CUresult sim_cuGraphInstantiate_legacy(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
    __asm__("cuGraphInstantiate_v2");
CUresult sim_cuGraphInstantiate_v1(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
    __asm__("cuGraphInstantiate");
CUresult sim_cuStreamBeginCapture_v1(CUstream s) __asm__("cuStreamBeginCapture");
CUresult sim_cuStreamGetCaptureInfo_v1(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id)
    __asm__("cuStreamGetCaptureInfo");

/* Everything below is hidden: the files reach each other's globals PC-relative. */
#pragma GCC visibility push(hidden)

#define MAGIC_CTX 0x43545831u
#define MAGIC_STREAM 0x53545231u
#define MAGIC_EVENT 0x45564e31u
#define MAGIC_MOD 0x4d4f4431u
#define MAGIC_FUNC 0x46554e31u
#define MAGIC_LIB 0x4c494231u
#define MAGIC_KERN 0x4b524e31u
#define MAGIC_POOL 0x504f4f31u
#define MAGIC_GRAPH 0x47525031u
#define MAGIC_GEXEC 0x47455831u
#define MAGIC_NODE 0x4e4f4431u
#define VMM_GRANULARITY (2ULL * MIB)
#define PITCH_ALIGN 512

/* ---- the objects the driver hands out ---- */
#define SIM_MAX_DEVS 16

struct sim_dev {
    int gpu;            /* index into the node's GPUs */
    int slot;           /* 0: whole GPU, 1+k: GPU instance k */
    int ci;             /* compute instance slot, -1 for a whole GPU */
    char uuid[96];
    unsigned char uuid_bytes[16];
    char name[256];
    uint64_t total;     /* bytes */
    int sm;
    CUmemoryPool default_pool;
    CUmemoryPool current_pool;
    CUcontext primary;
};

struct CUctx_st {
    uint32_t magic;
    int dev;
    int primary;
    int active;         /* primary: retained at least once and not reset */
    unsigned refcount;  /* primary retain count */
    unsigned flags;
    uint64_t last_end;  /* latest end of work submitted in this context */
    unsigned long long id;
    CUstream null_stream;
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned flags;
    int priority;
    uint64_t last_end;
    uint64_t *ring;     /* end times of queued kernels (bounded launch queue) */
    uint32_t ring_cap, ring_head, ring_count;
    unsigned long long id;
    CUgraph capture;          /* the graph a capture records launches into (cuda_graph.c) */
    CUgraphNode capture_last; /* the node the next captured launch depends on */
    cuuint64_t capture_id;
};

struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned flags;
    int recorded;
    uint64_t t;
};

struct sim_kernel {
    char name[128];
    uint64_t ns_per_block;
    uint64_t fixed_ns;
    int cost_param;     /* kernel parameter (uint64) giving ns per block; -1: none */
};

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;
    CUlibrary lib; /* the library this module is in this context (cuda_library.c), or NULL */
    int nfuncs;
    struct CUfunc_st *funcs;
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule mod;
    struct sim_kernel k;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int dev;
    int is_default;
    uint64_t reserved, used, reserved_high, used_high, release_threshold;
};

/* A launch: a kernel, its shape, the stream it goes to (cuda_launch.c; graphs keep them). */
struct launch {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    uint64_t cost_value;   /* value of the cost parameter, when the kernel has one */
    int has_cost_value;
};

/* ---- this process's driver state (cuda_core.c); g_mu guards it ---- */
extern pthread_mutex_t g_mu;
extern int g_initialized;               /* cuInit succeeded */
extern CUresult g_init_result;
extern struct sim_dev g_dev[SIM_MAX_DEVS];
extern int g_ndev;
extern unsigned long long g_next_id;    /* context and stream IDs */

/* Handle registries: a handle is valid while it is registered. */
struct reg {
    void **items;
    size_t n, cap;
};
extern struct reg r_ctx, r_stream, r_event, r_mod, r_func, r_pool, r_graph, r_gexec, r_node, r_lib, r_kern;

int reg_add(struct reg *r, void *p);

static inline int reg_has(const struct reg *r, const void *p)
{
    if (!p)
        return 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i] == p)
            return 1;
    return 0;
}

static inline void reg_del(struct reg *r, const void *p)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i] == p) {
            r->items[i] = r->items[--r->n];
            return;
        }
}

/* The allocations of this process: device memory, host memory, arrays, VMM handles and
 * ranges. */
enum alloc_kind {
    A_DEVICE, A_PITCH, A_MANAGED, A_ASYNC, A_ARRAY, A_HOST, A_VMM_HANDLE, A_VA_RANGE,
    A_HOST_REG,  /* registered (page-locked) host memory: the caller's, never unmapped here */
    A_MIPMAP,
};

struct alloc {
    uintptr_t ptr;
    size_t size;        /* mapped size */
    uint64_t charged;   /* bytes charged to the device */
    enum alloc_kind kind;
    int dev;
    CUcontext ctx;
    CUmemoryPool pool;
    int maps;           /* VMM handle: live mappings; VA range: mapped bytes */
    int released;       /* VMM handle released while still mapped */
    uintptr_t handle;   /* VMM mapping: the handle it maps */
};

extern struct alloc *g_alloc;
extern size_t g_nalloc;

/* A new, zeroed record (NULL: out of memory); it may move the others. */
struct alloc *alloc_add(void);
/* The allocation containing [p, p+n) that the device can address. */
struct alloc *alloc_containing(uintptr_t p, size_t n);

static inline struct alloc *alloc_find(uintptr_t p, enum alloc_kind kind)
{
    for (size_t i = 0; i < g_nalloc; i++)
        if (g_alloc[i].ptr == p && g_alloc[i].kind == kind)
            return &g_alloc[i];
    return NULL;
}

static inline void alloc_remove(struct alloc *a) { *a = g_alloc[--g_nalloc]; }

/* Fill a new allocation record. */
static inline void alloc_set(struct alloc *a, uintptr_t ptr, size_t size, uint64_t charged,
                             enum alloc_kind kind, int dev, CUcontext ctx)
{
    a->ptr = ptr;
    a->size = size;
    a->charged = charged;
    a->kind = kind;
    a->dev = dev;
    a->ctx = ctx;
}

static inline void *map_bytes(size_t n, int prot)
{
    void *p = mmap(NULL, n ? n : 1, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ---- what every entry point does first ---- */
static inline CUresult enter(const char *fn)
{
    if (!g_initialized)
        return g_init_result == CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : g_init_result;
    int code = sim_fault(fn);
    return (CUresult)code;
}

/* Not initialised, or a fault injected for this entry point (by its name): return that. */
#define ENTER()                                  \
    do {                                         \
        CUresult enter_rc_ = enter(__func__);    \
        if (enter_rc_ != CUDA_SUCCESS)           \
            return enter_rc_;                    \
    } while (0)

#define CHECK_DEV(d)                             \
    do {                                         \
        if ((d) < 0 || (d) >= g_ndev)            \
            return CUDA_ERROR_INVALID_DEVICE;    \
    } while (0)

/* ---- contexts and streams as every file needs them ---- */
static inline int ctx_usable(CUcontext c)
{
    return c && reg_has(&r_ctx, c) && (!c->primary || c->active);
}

/* cuda_current.c: this thread's current context, or CUDA_ERROR_INVALID_CONTEXT (caller holds
 * g_mu); a new context made current (cuCtxCreate); a destroyed one off this thread's stack. */
CUresult need_ctx(CUcontext *out);
void current_push_new(CUcontext c);
void current_forget(CUcontext c);

static inline struct sim_dev *dev_of(CUcontext c) { return &g_dev[c->dev]; }

static inline int stream_ok(CUstream s) { return reg_has(&r_stream, s); }

/* ---- device memory in the node's shared state ---- */
static inline CUresult charge(int dev, uint64_t bytes)
{
    if (sim_lock(0) != 0)
        return CUDA_ERROR_UNKNOWN;
    int rc = sim_charge_locked(g_dev[dev].gpu, g_dev[dev].slot, bytes);
    sim_unlock();
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static inline void uncharge(int dev, uint64_t bytes)
{
    if (bytes == 0 || sim_lock(0) != 0)
        return;
    sim_uncharge_locked(g_dev[dev].gpu, g_dev[dev].slot, bytes);
    sim_unlock();
}

/* Unmap, uncharge and forget one allocation. */
static inline void dev_release(struct alloc *a)
{
    munmap((void *)a->ptr, a->size ? a->size : 1);
    uncharge(a->dev, a->charged);
    alloc_remove(a);
}

/* Give a pool's reserved-but-unused memory back to the device, down to `keep` bytes. */
static inline void pool_trim(CUmemoryPool p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    if (p->reserved > floor) {
        uncharge(p->dev, p->reserved - floor);
        p->reserved = floor;
    }
}

/* ---- what one file does for another ---- */
/* cuda_stream.c */
CUresult stream_new(CUcontext c, unsigned flags, int prio, CUstream *out);
void stream_free(CUstream s);
/* Resolve a stream argument (NULL, legacy, per-thread: the current context's). Caller holds g_mu. */
CUresult stream_lookup(CUstream s, CUstream *out);
/* cuda_module.c */
void module_free(CUmodule m);
/* The text a module image holds (a fatbin's PTX, PTX, the simulator's own format). */
CUresult module_image(const void *image, const char **text, size_t *len);
/* Load a module image's text into context c. Caller holds g_mu. */
CUresult module_load_locked(CUcontext c, const char *img, size_t len, CUmodule *pm);
/* cuda_library.c: f itself, or the function a CUkernel passed as f has in the current
 * context (loaded there now if it was not); NULL if f is neither. Caller holds g_mu. */
CUfunction func_resolve(CUfunction f);

/* cuda_export.c: forget the values the runtime kept for a destroyed context */
void sim_ctx_storage_drop(CUcontext c);
static inline int max_blocks_per_sm(int threads)
{
    if (threads <= 0)
        return 0;
    int b = 2048 / threads;
    return b > 32 ? 32 : b;
}
/* cuda_launch.c: put a launch on its device's timeline */
CUresult launch_do(struct launch *l, int cooperative);
/* cuda_graph.c: a launch on a stream that is capturing becomes a node of its graph (1, *rc
 * the outcome); 0: the stream is not capturing, launch it. */
int capture_launch(const struct launch *l, void **params, CUresult *rc);

#pragma GCC visibility pop
#endif
