/* libtessera: core budgets.  Launches spend tokens (1 per kernel, a graph what its kernel
 * nodes cost) from the container's bucket; graph memory nodes are refused under a budget. */
#include "hook.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

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
    if (!l && __atomic_load_n(&ledger_lost, __ATOMIC_RELAXED))
        l = &ledger; /* its private zeros: a bucket of this process's own */
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

static int launch_entry_multi(void)
{
    CUdevice d;
    if (!r_cuCtxGetDevice || r_cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return 0;
    int e = entry_of_ordinal(d);
    return e < 0 ? 0 : e;
}

/* Spend `kernels` tokens before a launch; waits when the bucket is empty. */
static inline __attribute__((always_inline)) void spend(uint64_t kernels)
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
