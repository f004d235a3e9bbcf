/* libtessera: core budgets.  Launches spend tokens (1 per kernel, a graph what its kernel
 * nodes cost) from the container's bucket (tokens.h); graph memory nodes are refused under a
 * budget. */
#include "ledger_attach.h"
#include "records.h"
#include "startup.h"
#include "tokens.h"

#include <stdlib.h>

/* A kernel launch's fast path (no call: see the hooks below): under a budget file of one
 * entry (the started library's usual case), spend_fast(); with no budget at all, nothing to
 * spend once started.  False: everything again the slow way (spend()). */
static inline __attribute__((always_inline)) int launch_fast(uint64_t kernels)
{
    const volatile unsigned char *map = budget_one_map();
    if (LIKELY(map != NULL))
        return spend_fast(map, kernels);
    return budget_mode() == MODE_OFF && __atomic_load_n(&cu_ready, __ATOMIC_ACQUIRE);
}

/* A kernel launch is counted in this process's ledger slot, spends `kernels` tokens, then is
 * the driver's (a process's first launch takes the slow path, which joins its ledger).  Each comes with its
 * per-thread-default-stream twin, of the same parameters.  The hook makes no call but the
 * driver's on its fast path and passes everything else to name##_slow, of the same
 * parameters: both are jumps (sibling calls), so the hook saves nothing across a call. */
#define LAUNCH_HOOK(name, params, args, kernels)                                           \
    static CUresult __attribute__((noinline)) name##_slow params                           \
    {                                                                                      \
        CU_READY();                                                                        \
        REAL_OR_FAIL(name);                                                                \
        count_launches(kernels);                                                           \
        spend(kernels);                                                                    \
        return REAL(name) args;                                                            \
    }                                                                                      \
    EXPORT CUresult CUDAAPI name params                                                    \
    {                                                                                      \
        if (LIKELY(launch_fast(kernels) && REAL(name))) {                                  \
            count_launches_fast(kernels);                                                  \
            return REAL(name) args;                                                        \
        }                                                                                  \
        return name##_slow args;                                                           \
    }
/* A graph launch spends what its kernels cost (found in this process's records). */
#define GRAPH_LAUNCH_HOOK(name, params, args, cost)                                        \
    EXPORT CUresult CUDAAPI name params                                                    \
    {                                                                                      \
        CU_READY();                                                                        \
        REAL_OR_FAIL(name);                                                                \
        uint64_t kernels = cost;                                                           \
        count_launches(kernels);                                                           \
        spend(kernels);                                                                    \
        return REAL(name) args;                                                            \
    }
#define KERNEL_PARAMS                                                                      \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,        \
     unsigned bz, unsigned sh, CUstream s, void **params, void **extra)
#define COOPERATIVE_PARAMS                                                                 \
    (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,        \
     unsigned bz, unsigned sh, CUstream s, void **params)
#define EX_PARAMS (const CUlaunchConfig *c, CUfunction f, void **p, void **x)
#define KERNEL_ARGS (f, gx, gy, gz, bx, by, bz, sh, s, params, extra)
#define COOPERATIVE_ARGS (f, gx, gy, gz, bx, by, bz, sh, s, params)

LAUNCH_HOOK(cuLaunchKernel, KERNEL_PARAMS, KERNEL_ARGS, 1)
LAUNCH_HOOK(cuLaunchKernel_ptsz, KERNEL_PARAMS, KERNEL_ARGS, 1)
LAUNCH_HOOK(cuLaunchKernelEx, EX_PARAMS, (c, f, p, x), 1)
LAUNCH_HOOK(cuLaunchKernelEx_ptsz, EX_PARAMS, (c, f, p, x), 1)
LAUNCH_HOOK(cuLaunchCooperativeKernel, COOPERATIVE_PARAMS, COOPERATIVE_ARGS, 1)
LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, COOPERATIVE_PARAMS, COOPERATIVE_ARGS, 1)

/* A graph costs what its kernels cost: counted once, at instantiation. */
static uint64_t graph_kernels(CUgraph g, int depth)
{
    size_t n = 0;
    if (!g || depth > 8 || !drv.cuGraphGetNodes || !drv.cuGraphNodeGetType ||
        drv.cuGraphGetNodes(g, NULL, &n) != CUDA_SUCCESS || n == 0 || n > (1u << 20))
        return 0;
    CUgraphNode *nodes = calloc(n, sizeof *nodes);
    if (!nodes)
        return 0;
    uint64_t k = 0;
    if (drv.cuGraphGetNodes(g, nodes, &n) == CUDA_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            CUgraphNodeType t;
            if (drv.cuGraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
                continue;
            if (t == CU_GRAPH_NODE_TYPE_KERNEL)
                k++;
            else if (t == CU_GRAPH_NODE_TYPE_GRAPH && drv.cuGraphChildGraphNodeGetGraph) {
                CUgraph c;
                if (drv.cuGraphChildGraphNodeGetGraph(nodes[i], &c) == CUDA_SUCCESS)
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
    if (r == CUDA_SUCCESS && ex && budget_mode() != MODE_OFF) {
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
    if (budget_mode() == MODE_OFF)
        return 1;
    return rec_get(K_GEXEC, (uint64_t)(uintptr_t)ex, 0, &rc) ? rc.bytes : 1;
}

GRAPH_LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec ex, CUstream s), (ex, s), graph_cost(ex))
GRAPH_LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec ex, CUstream s), (ex, s), graph_cost(ex))

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
    if (budget_mode() != MODE_OFF)
        GRAPHMEM_REFUSE("cuGraphAddMemAllocNode");
    REAL_OR_FAIL(cuGraphAddMemAllocNode);
    return REAL(cuGraphAddMemAllocNode)(n, g, deps, ndeps, p);
}

EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                      size_t ndeps, CUgraphNodeParams *p)
{
    CU_READY();
    if (budget_mode() != MODE_OFF && p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        GRAPHMEM_REFUSE("cuGraphAddNode(CU_GRAPH_NODE_TYPE_MEM_ALLOC)");
    REAL_OR_FAIL(cuGraphAddNode);
    return REAL(cuGraphAddNode)(n, g, deps, ndeps, p);
}

EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                         const CUgraphEdgeData *edges, size_t ndeps,
                                         CUgraphNodeParams *p)
{
    CU_READY();
    if (budget_mode() != MODE_OFF && p && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        GRAPHMEM_REFUSE("cuGraphAddNode_v2(CU_GRAPH_NODE_TYPE_MEM_ALLOC)");
    REAL_OR_FAIL(cuGraphAddNode_v2);
    return REAL(cuGraphAddNode_v2)(n, g, deps, edges, ndeps, p);
}
