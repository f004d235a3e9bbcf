/* Fake libcuda.so.1: streams and events.  A stream keeps the end time of the last kernel
 * put on it (and a bounded queue of pending ones); synchronising sleeps until then.  An
 * event records the time its stream's work ends. */
#include "cuda_core.h"

#include <string.h>

CUresult stream_new(CUcontext c, unsigned flags, int prio, CUstream *out)
{
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ring_cap = sim_state()->launch_queue_depth;
    s->ring = calloc(s->ring_cap, sizeof *s->ring);
    if (!s->ring || reg_add(&r_stream, s) != 0) {
        free(s->ring);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    s->flags = flags;
    s->priority = prio;
    s->id = g_next_id++;
    *out = s;
    return CUDA_SUCCESS;
}

void stream_free(CUstream s)
{
    if (!s)
        return;
    reg_del(&r_stream, s);
    s->magic = 0;
    free(s->ring);
    free(s);
}

EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = stream_new(c, flags, 0, ph);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    if (rc == CUDA_SUCCESS)
        rc = stream_new(c, flags, priority, ph);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!stream_ok(s) || s == s->ctx->null_stream)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else
        stream_free(s);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

CUresult stream_lookup(CUstream s, CUstream *out)
{
    CUcontext c = NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        CUresult rc = need_ctx(&c);
        if (rc != CUDA_SUCCESS)
            return rc;
        *out = c->null_stream;
        return CUDA_SUCCESS;
    }
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_usable(s->ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s;
    return CUDA_SUCCESS;
}

/* After a synchronisation the driver returns pool memory above the release threshold. */
static void trim_pools_of(int dev)
{
    for (size_t i = 0; i < r_pool.n; i++) {
        CUmemoryPool p = r_pool.items[i];
        if (p->dev == dev)
            pool_trim(p, p->release_threshold);
    }
}


EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    uint64_t until = 0;
    int dev = 0;
    if (rc == CUDA_SUCCESS) {
        /* The legacy default stream waits for every blocking stream of its context. */
        until = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        dev = st->ctx->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_sleep_until(until);
    pthread_mutex_lock(&g_mu);
    trim_pools_of(dev);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS) {
        uint64_t until = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        rc = sim_now_ns() >= until ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* What a stream says of itself (NULL, legacy, per-thread: the current context's). */
#define STREAM_GETTER(fn, type, field)                  \
    EXPORT CUresult fn(CUstream s, type *out)           \
    {                                                   \
        ENTER();                                        \
        if (!out)                                       \
            return CUDA_ERROR_INVALID_VALUE;            \
        pthread_mutex_lock(&g_mu);                      \
        CUstream st = NULL;                             \
        CUresult rc = stream_lookup(s, &st);            \
        if (rc == CUDA_SUCCESS)                         \
            *out = st->field;                           \
        pthread_mutex_unlock(&g_mu);                    \
        return rc;                                      \
    }
STREAM_GETTER(cuStreamGetCtx, CUcontext, ctx)
STREAM_GETTER(cuStreamGetFlags, unsigned int, flags)
STREAM_GETTER(cuStreamGetPriority, int, priority)

EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS) {
        CUevent e = calloc(1, sizeof *e);
        if (!e || reg_add(&r_event, e) != 0) {
            free(e);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = MAGIC_EVENT;
            e->ctx = c;
            e->flags = flags;
            *ph = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    CUstream st = NULL;
    if (rc == CUDA_SUCCESS)
        rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS) {
        uint64_t now = sim_now_ns();
        uint64_t end = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        e->t = end > now ? end : now;
        e->recorded = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags)
{
    (void)flags;
    return cuEventRecord(e, s);
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && e->recorded && sim_now_ns() < e->t)
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    uint64_t t = rc == CUDA_SUCCESS && e->recorded ? e->t : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        sim_sleep_until(t);
    return rc;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    ENTER();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!reg_has(&r_event, a) || !reg_has(&r_event, b))
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (sim_now_ns() < a->t || sim_now_ns() < b->t)
        rc = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)b->t - (int64_t)a->t) / 1e6);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        reg_del(&r_event, e);
        e->magic = 0;
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    ENTER();
    (void)flags;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = reg_has(&r_event, e) ? stream_lookup(s, &st) : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && e->recorded && e->t > st->last_end)
        st->last_end = e->t;
    pthread_mutex_unlock(&g_mu);
    return rc;
}
