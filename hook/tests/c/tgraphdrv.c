/* tgraphdrv: a test-only libcuda.so.1 for the simulator, which has no graph memory nodes.
 * It adds cuGraphAddMemAllocNode, cuGraphAddNode and cuGraphAddNode_v2: exported, and
 * answered by its own cuGetProcAddress(_v2) at their CUDA versions with internal addresses,
 * as a real driver answers.  Every other exported symbol is the simulator's libcuda.so.1, its
 * one dependency (by absolute path).  Its cuGetProcAddress knows only these names and itself
 * (forwarding would have to look the simulator's up with dlsym, which the hook answers with
 * its own cuGetProcAddress: a loop), so only `tprobe graphmem` is run over it.
 * The added entry points only pretend: they succeed and allocate nothing. */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#undef cuGetProcAddress
#define EXPORT __attribute__((visibility("default")))

static CUresult d_alloc_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                             CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    (void)g;
    (void)deps;
    (void)nd;
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *n = (CUgraphNode)(uintptr_t)0x1000;
    p->dptr = (CUdeviceptr)0x7f0000000000ull;
    return CUDA_SUCCESS;
}

static CUresult d_add_node(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                           CUgraphNodeParams *p)
{
    (void)g;
    (void)deps;
    (void)nd;
    if (!n || !p)
        return CUDA_ERROR_INVALID_VALUE;
    *n = (CUgraphNode)(uintptr_t)0x2000;
    return CUDA_SUCCESS;
}

static CUresult d_add_node_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                              const CUgraphEdgeData *e, size_t nd, CUgraphNodeParams *p)
{
    (void)e;
    return d_add_node(n, g, deps, nd, p);
}

EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                              size_t nd, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    return d_alloc_node(n, g, deps, nd, p);
}
EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode *n, CUgraph g, const CUgraphNode *deps, size_t nd,
                                      CUgraphNodeParams *p)
{
    return d_add_node(n, g, deps, nd, p);
}
EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *n, CUgraph g, const CUgraphNode *deps,
                                         const CUgraphEdgeData *e, size_t nd, CUgraphNodeParams *p)
{
    return d_add_node_v2(n, g, deps, e, nd, p);
}

static CUresult d_gpa2(const char *s, void **pfn, int ver, cuuint64_t fl,
                       CUdriverProcAddressQueryResult *st);
static CUresult d_gpa1(const char *s, void **pfn, int ver, cuuint64_t fl);

static void *own(const char *s, int ver)
{
    if (!s)
        return NULL;
    if (!strcmp(s, "cuGraphAddMemAllocNode") && ver >= 11040)
        return (void *)&d_alloc_node;
    if (!strcmp(s, "cuGraphAddNode") && ver >= 12030)
        return (void *)&d_add_node_v2;
    if (!strcmp(s, "cuGraphAddNode") && ver >= 12020)
        return (void *)&d_add_node;
    if (!strcmp(s, "cuGetProcAddress") && ver >= 12000)
        return (void *)&d_gpa2;
    if (!strcmp(s, "cuGetProcAddress") && ver >= 11030)
        return (void *)&d_gpa1;
    return NULL;
}

static CUresult d_gpa2(const char *s, void **pfn, int ver, cuuint64_t fl,
                       CUdriverProcAddressQueryResult *st)
{
    (void)fl;
    void *p = own(s, ver);
    if (pfn)
        *pfn = p;
    if (st)
        *st = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

static CUresult d_gpa1(const char *s, void **pfn, int ver, cuuint64_t fl)
{
    return d_gpa2(s, pfn, ver, fl, NULL);
}

EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *s, void **pfn, int ver, cuuint64_t fl,
                                           CUdriverProcAddressQueryResult *st);
EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *s, void **pfn, int ver, cuuint64_t fl,
                                           CUdriverProcAddressQueryResult *st)
{
    return d_gpa2(s, pfn, ver, fl, st);
}

EXPORT CUresult CUDAAPI cuGetProcAddress(const char *s, void **pfn, int ver, cuuint64_t fl);
EXPORT CUresult CUDAAPI cuGetProcAddress(const char *s, void **pfn, int ver, cuuint64_t fl)
{
    return d_gpa1(s, pfn, ver, fl);
}
