/* Fake libcuda.so.1: graphs of kernel nodes.  Instantiation copies the nodes' launches (in
 * insertion order, which is topological); a graph launch puts them on the stream one after
 * the other. */
#include "cuda_core.h"

#include <string.h>

struct CUgraphNode_st {
    uint32_t magic;
    CUgraph graph;
    struct launch l;
};

struct CUgraph_st {
    uint32_t magic;
    CUgraphNode *nodes;
    size_t n;
};

struct CUgraphExec_st {
    uint32_t magic;
    struct launch *l;
    size_t n;
};

EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
    ENTER();
    if (!pg || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUgraph g = calloc(1, sizeof *g);
    CUresult rc = g && reg_add(&r_graph, g) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        g->magic = MAGIC_GRAPH;
        *pg = g;
    } else {
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        for (size_t i = 0; i < g->n; i++) {
            reg_del(&r_node, g->nodes[i]);
            free(g->nodes[i]);
        }
        free(g->nodes);
        reg_del(&r_graph, g);
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult add_kernel_node(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUfunction f,
                                unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned shmem, void **params, void **extra)
{
    if (!pn || (ndeps && !deps) || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < ndeps; i++)
        if (!reg_has(&r_node, deps[i]) || deps[i]->graph != g)
            rc = CUDA_ERROR_INVALID_VALUE;
    struct launch l = {f, gx, gy, gz, bx, by, bz, shmem, NULL, 0, 0};
    if (rc == CUDA_SUCCESS && !reg_has(&r_func, f))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && f->k.cost_param >= 0) {
        /* Like the real graph, node parameters are copied at creation. */
        if (!params || !params[f->k.cost_param])
            rc = CUDA_ERROR_INVALID_VALUE;
        else {
            memcpy(&l.cost_value, params[f->k.cost_param], sizeof l.cost_value);
            l.has_cost_value = 1;
        }
    }
    if (rc == CUDA_SUCCESS) {
        CUgraphNode n = calloc(1, sizeof *n);
        CUgraphNode *nn = n ? realloc(g->nodes, (g->n + 1) * sizeof *nn) : NULL;
        if (!nn || reg_add(&r_node, n) != 0) {
            if (nn)
                g->nodes = nn;
            free(n);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            g->nodes = nn;
            n->magic = MAGIC_NODE;
            n->graph = g;
            n->l = l;
            g->nodes[g->n++] = n;
            *pn = n;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                        const CUDA_KERNEL_NODE_PARAMS *p)
{
    ENTER();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(pn, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

EXPORT CUresult sim_cuGraphAddKernelNode_v1(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                            const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    ENTER();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(pn, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    ENTER();
    (void)flags;
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUgraphExec e = calloc(1, sizeof *e);
        struct launch *l = calloc(g->n ? g->n : 1, sizeof *l);
        if (!e || !l || reg_add(&r_gexec, e) != 0) {
            free(e);
            free(l);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            /* Nodes were added after their dependencies: insertion order is topological. */
            for (size_t i = 0; i < g->n; i++)
                l[i] = g->nodes[i]->l;
            e->magic = MAGIC_GEXEC;
            e->l = l;
            e->n = g->n;
            *pe = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult sim_cuGraphInstantiate_legacy(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    if (err)
        *err = NULL;
    if (log && n)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(pe, g, 0);
}

EXPORT CUresult sim_cuGraphInstantiate_v1(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    return sim_cuGraphInstantiate_legacy(pe, g, err, log, n);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    int ok = reg_has(&r_gexec, e);
    size_t n = ok ? e->n : 0;
    struct launch *copy_l = ok ? calloc(n ? n : 1, sizeof *copy_l) : NULL;
    if (copy_l)
        memcpy(copy_l, e->l, n * sizeof *copy_l);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    if (!copy_l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        copy_l[i].stream = s;
        rc = launch_do(&copy_l[i], 0);
    }
    free(copy_l);
    return rc;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_gexec, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        reg_del(&r_gexec, e);
        free(e->l);
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
