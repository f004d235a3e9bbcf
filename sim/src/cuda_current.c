/* Fake libcuda.so.1: the current context.  Each thread has a stack of current contexts
 * (cuCtxPush/PopCurrent, cuCtxSetCurrent); the top is the one most calls act on. */
#include "cuda_core.h"

/* This thread's stack of current contexts. */
static __thread CUcontext t_stack[32];
static __thread int t_depth;

static CUcontext current_ctx(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

CUresult need_ctx(CUcontext *out)
{
    CUcontext c = current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_usable(c))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

void current_push_new(CUcontext c)
{
    if (t_depth < 32)
        t_stack[t_depth++] = c;
    else
        t_stack[t_depth - 1] = c;
}

void current_forget(CUcontext c)
{
    /* Only this thread's stack is reachable; other threads see a destroyed context. */
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == c)
            t_stack[i] = NULL;
    while (t_depth > 0 && t_stack[t_depth - 1] == NULL)
        t_depth--;
}


EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!ctx_usable(c))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (t_depth >= 32)
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        t_stack[t_depth++] = c;
    pthread_mutex_unlock(&g_mu);
    return rc;
}


EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    ENTER();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}


EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    ENTER();
    if (c == NULL) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_mu);
    int ok = reg_has(&r_ctx, c);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = c;
    return CUDA_SUCCESS;
}


EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}
