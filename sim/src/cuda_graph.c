/* Fake libcuda.so.1: graphs of kernel nodes, built node by node or captured from a stream
 * (kernel launches on a capturing stream become nodes, each depending on the one before;
 * memory operations on it still run at once, uncaptured: the simulator's graphs hold
 * kernels only).
 * Instantiation copies the nodes' launches (in insertion order, which is topological); a
 * graph launch puts them on the stream one after the other. */
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
    if (rc == CUDA_SUCCESS && !(f = func_resolve(f)))
        rc = CUDA_ERROR_INVALID_VALUE;
    struct launch l = {f, gx, gy, gz, bx, by, bz, shmem, NULL, 0, 0};
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

/* ---- stream capture ------------------------------------------------------------------- */

static __thread CUstreamCaptureMode thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static cuuint64_t capture_ids;

/* The stream s names, capturing or not. Caller holds g_mu. */
static CUresult capture_stream(CUstream s, CUstream *out)
{
    return stream_lookup(s, out);
}

EXPORT CUresult cuStreamBeginCapture(CUstream s, CUstreamCaptureMode mode)
{
    ENTER();
    if (mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (s == NULL || s == CU_STREAM_LEGACY)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot capture */
    CUgraph g = NULL;
    CUresult rc = cuGraphCreate(&g, 0);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    rc = capture_stream(s, &st);
    if (rc == CUDA_SUCCESS && st->capture)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    if (rc == CUDA_SUCCESS) {
        st->capture = g;
        st->capture_last = NULL;
        st->capture_id = ++capture_ids;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        cuGraphDestroy(g);
    return rc;
}

EXPORT CUresult sim_cuStreamBeginCapture_v1(CUstream s)
{
    return cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *pg)
{
    ENTER();
    if (!pg)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = capture_stream(s, &st);
    if (rc == CUDA_SUCCESS && !st->capture)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    if (rc == CUDA_SUCCESS) {
        *pg = st->capture;
        st->capture = NULL;
        st->capture_last = NULL;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    ENTER();
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = capture_stream(s, &st);
    if (rc == CUDA_SUCCESS)
        *status = st->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *g,
                                          const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *ndeps)
{
    ENTER();
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = capture_stream(s, &st);
    if (rc == CUDA_SUCCESS) {
        *status = st->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
        if (id && st->capture)
            *id = st->capture_id;
        if (g)
            *g = st->capture;
        if (deps)
            *deps = st->capture_last ? &st->capture_last : NULL;
        if (edges)
            *edges = NULL;
        if (ndeps)
            *ndeps = st->capture_last ? 1 : 0;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *g,
                                          const CUgraphNode **deps, size_t *ndeps)
{
    return cuStreamGetCaptureInfo_v3(s, status, id, g, deps, NULL, ndeps);
}

EXPORT CUresult sim_cuStreamGetCaptureInfo_v1(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id)
{
    return cuStreamGetCaptureInfo_v3(s, status, id, NULL, NULL, NULL, NULL);
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (!mode || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

int capture_launch(const struct launch *l, void **params, CUresult *rc)
{
    if (l->stream == NULL || l->stream == CU_STREAM_LEGACY || l->stream == CU_STREAM_PER_THREAD)
        return 0;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUgraph g = NULL;
    CUgraphNode last = NULL;
    if (stream_lookup(l->stream, &st) == CUDA_SUCCESS && st->capture) {
        g = st->capture;
        last = st->capture_last;
    }
    pthread_mutex_unlock(&g_mu);
    if (!g)
        return 0;
    CUgraphNode n = NULL;
    *rc = add_kernel_node(&n, g, last ? &last : NULL, last ? 1 : 0, l->f, l->gx, l->gy, l->gz, l->bx, l->by,
                          l->bz, l->shmem, params, NULL);
    if (*rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        if (st->capture == g)
            st->capture_last = n;
        pthread_mutex_unlock(&g_mu);
    }
    return 1;
}

EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n)
{
    ENTER();
    if (!n)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        if (nodes)
            for (size_t i = 0; i < *n && i < g->n; i++)
                nodes[i] = g->nodes[i];
        if (!nodes || *n > g->n)
            *n = g->n;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Every node of the simulator's graphs is a kernel node. */
EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *type)
{
    ENTER();
    if (!type)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_node, n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *type = CU_GRAPH_NODE_TYPE_KERNEL;
    pthread_mutex_unlock(&g_mu);
    return rc;
}
