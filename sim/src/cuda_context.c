/* Fake libcuda.so.1: contexts.  Primary contexts (one per device, retained and released)
 * and contexts of their own, what they say of themselves, and what a context
 * holds on the node: its device memory (the node's context_mib) and everything allocated in
 * it, freed when it is destroyed, as the real driver does. */
#include "cuda_core.h"

#include <string.h>

static void free_ctx_resources(CUcontext c);

/* Register this process's context on the device in the shared state. */
static CUresult ctx_attach_node(int dev)
{
    struct sim_dev *d = &g_dev[dev];
    if (sim_lock(0) != 0)
        return CUDA_ERROR_UNKNOWN;
    struct sim_proc *self = sim_self_locked();
    CUresult rc = CUDA_SUCCESS;
    if (!self) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uint64_t ctx_bytes = sim_state()->context_mib * MIB;
        if (ctx_bytes && sim_charge_locked(d->gpu, d->slot, ctx_bytes) != 0) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            self->ctx[d->gpu][d->slot]++;
            self->ci[d->gpu][d->slot] = d->ci >= 0 ? (int32_t)sim_state()->gpu[d->gpu].gi[d->slot - 1].ci[d->ci].id : -1;
        }
    }
    sim_unlock();
    return rc;
}

static void ctx_detach_node(int dev)
{
    struct sim_dev *d = &g_dev[dev];
    if (sim_lock(0) != 0)
        return;
    struct sim_proc *self = sim_self_locked();
    if (self) {
        if (self->ctx[d->gpu][d->slot] > 0)
            self->ctx[d->gpu][d->slot]--;
        sim_uncharge_locked(d->gpu, d->slot, sim_state()->context_mib * MIB);
    }
    sim_unlock();
}

static CUresult ctx_new(int dev, int primary, unsigned flags, CUcontext *out)
{
    CUcontext c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = MAGIC_CTX;
    c->dev = dev;
    c->primary = primary;
    c->flags = flags;
    c->id = g_next_id++;
    if (reg_add(&r_ctx, c) != 0) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (stream_new(c, 0, 0, &c->null_stream) != CUDA_SUCCESS) {
        reg_del(&r_ctx, c);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_activate(CUcontext c)
{
    CUresult rc = ctx_attach_node(c->dev);
    if (rc == CUDA_SUCCESS)
        c->active = 1;
    return rc;
}

static void ctx_deactivate(CUcontext c)
{
    if (!c->active)
        return;
    free_ctx_resources(c);
    ctx_detach_node(c->dev);
    c->active = 0;
    c->last_end = 0;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    struct sim_dev *sd = &g_dev[d];
    if (!sd->primary)
        rc = ctx_new(d, 1, 0, &sd->primary);
    if (rc == CUDA_SUCCESS && !sd->primary->active)
        rc = ctx_activate(sd->primary);
    if (rc == CUDA_SUCCESS) {
        sd->primary->refcount++;
        *pctx = sd->primary;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    CUcontext c = g_dev[d].primary;
    if (!c || c->refcount == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refcount == 0) {
        ctx_deactivate(c);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = g_dev[d].primary;
    if (c) {
        ctx_deactivate(c);
        c->refcount = 0;
        c->flags = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    ENTER();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = g_dev[d].primary;
    *flags = c ? c->flags : 0;
    *active = c ? c->active : 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags)
{
    ENTER();
    CHECK_DEV(d);
    if (flags & ~(unsigned)(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                            CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!g_dev[d].primary)
        rc = ctx_new(d, 1, 0, &g_dev[d].primary);
    if (rc == CUDA_SUCCESS)
        g_dev[d].primary->flags = flags;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice d)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = ctx_new(d, 0, flags, &c);
    if (rc == CUDA_SUCCESS) {
        rc = ctx_activate(c);
        if (rc != CUDA_SUCCESS) {
            stream_free(c->null_stream);
            reg_del(&r_ctx, c);
            free(c);
        }
    }
    if (rc == CUDA_SUCCESS) {
        current_push_new(c);
        *pctx = c;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d) { return ctx_create(pctx, flags, d); }

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice d)
{
    if (n < 0 || (n > 0 && !p))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice d)
{
    (void)p;
    return ctx_create(pctx, flags, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!c || !reg_has(&r_ctx, c) || c->primary) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        ctx_deactivate(c);
        current_forget(c);
        stream_free(c->null_stream);
        reg_del(&r_ctx, c);
        c->magic = 0;
        free(c);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* The context a query names: `c`, or the current one when NULL.  Caller holds g_mu. */
static CUresult ctx_named(CUcontext *c)
{
    if (!*c)
        return need_ctx(c);
    return ctx_usable(*c) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* What a context says of itself: `named` is the context asked about (NULL: the current one),
 * `value` the answer, of context c. */
#define CTX_GETTER(fn, params, named, value)            \
    EXPORT CUresult fn params                           \
    {                                                   \
        ENTER();                                        \
        if (!out)                                       \
            return CUDA_ERROR_INVALID_VALUE;            \
        pthread_mutex_lock(&g_mu);                      \
        CUcontext c = named;                            \
        CUresult rc = ctx_named(&c);                    \
        if (rc == CUDA_SUCCESS)                         \
            *out = value;                               \
        pthread_mutex_unlock(&g_mu);                    \
        return rc;                                      \
    }
CTX_GETTER(cuCtxGetDevice, (CUdevice *out), NULL, c->dev)
CTX_GETTER(cuCtxGetFlags, (unsigned int *out), NULL, c->flags)
CTX_GETTER(cuCtxGetId, (CUcontext ctx, unsigned long long *out), ctx, c->id)
CTX_GETTER(cuCtxGetApiVersion, (CUcontext ctx, unsigned int *out), ctx, 3020)

EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit limit)
{
    ENTER();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: *v = 1024; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *v = 1 << 20; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *v = 8 << 20; break;
    default: return CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t v)
{
    ENTER();
    (void)v;
    if (limit > CU_LIMIT_MAX_L2_FETCH_GRANULARITY && limit != CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    uint64_t until = rc == CUDA_SUCCESS ? c->last_end : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        sim_sleep_until(until);
    return rc;
}

/* Destroying a context frees everything allocated in it, as the driver does. */
static void free_ctx_resources(CUcontext c)
{
    sim_ctx_storage_drop(c);
    for (size_t i = 0; i < g_nalloc;) {
        struct alloc *a = &g_alloc[i];
        if (a->ctx != c) {
            i++;
            continue;
        }
        if (a->kind == A_ARRAY || a->kind == A_MIPMAP) {
            uncharge(a->dev, a->charged);
            free((void *)a->ptr);
            alloc_remove(a);
        } else if (a->kind == A_HOST_REG) {
            alloc_remove(a); /* unregistered; the memory is the caller's */
        } else {
            if (a->kind == A_ASYNC && a->pool)
                a->pool->used -= a->size;
            dev_release(a);
        }
    }
    for (size_t i = 0; i < r_pool.n; i++) {
        CUmemoryPool p = r_pool.items[i];
        if (p->dev == c->dev && p->is_default)
            pool_trim(p, 0);
    }
    for (size_t i = 0; i < r_mod.n;) {
        CUmodule m = r_mod.items[i];
        if (m->ctx == c)
            module_free(m);
        else
            i++;
    }
    for (size_t i = 0; i < r_stream.n;) {
        CUstream s = r_stream.items[i];
        if (s->ctx == c && s != c->null_stream)
            stream_free(s);
        else
            i++;
    }
    for (size_t i = 0; i < r_event.n;) {
        CUevent e = r_event.items[i];
        if (e->ctx == c) {
            reg_del(&r_event, e);
            free(e);
        } else {
            i++;
        }
    }
    c->null_stream->last_end = 0;
    c->null_stream->ring_count = 0;
}
