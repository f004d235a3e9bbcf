/* libtessera: contexts.  A context holds device memory of its own (hundreds of MiB on a real
 * H100), which no allocation call shows; the budget entry says how much one holds (the
 * daemon measures it on the node), and every context a process creates is charged that
 * much: reserved before the driver creates it, given back when it is destroyed.
 *
 * The primary context of a device exists once per process however often it is retained: it
 * is charged at the retain that finds it uncounted and given back when the driver reports it
 * inactive after a release or a reset. */
#include "count.h"
#include "startup.h"

/* Reserve what one context on ordinal ord holds.  CUDA_SUCCESS with *entry (-1: nothing to
 * count) and *bytes set, or the error to return (a device outside the budget gets none). */
static CUresult ctx_reserve(int ord, int *entry, uint64_t *bytes)
{
    *bytes = 0;
    CUresult r = resolve_entry(&ord, entry);
    if (r != CUDA_SUCCESS || *entry < 0)
        return r;
    ledger_join_early(); /* its launches are counted there from the first (ledger_attach.h) */
    uint64_t b = budget_context_bytes(*entry);
    if (b == 0) {
        *entry = -1; /* contexts cost nothing on this device */
        return CUDA_SUCCESS;
    }
    r = reserve_entry(*entry, b);
    if (r != CUDA_SUCCESS) {
        *entry = -1;
        return r;
    }
    *bytes = b;
    return CUDA_SUCCESS;
}

/* ---- the primary context ---- */
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuDevicePrimaryCtxRetain);
    struct rec have;
    if (!pctx || budget_mode() == MODE_OFF || rec_get(K_PRIMARY, (uint64_t)dev, 0, &have))
        return REAL(cuDevicePrimaryCtxRetain)(pctx, dev); /* counted while it lives */
    int e;
    uint64_t b;
    CUresult r = ctx_reserve(dev, &e, &b);
    if (r != CUDA_SUCCESS)
        return r;
    ENTER();
    r = REAL(cuDevicePrimaryCtxRetain)(pctx, dev);
    LEAVE();
    if (r != CUDA_SUCCESS || e < 0) {
        unreserve(e, b);
        return r;
    }
    struct rec rc = {(uint64_t)dev, b, e, K_PRIMARY, 0, 0};
    int added = rec_add(&rc, 0);
    if (added == 0) {
        unreserve(e, b); /* another thread counted it first */
    } else if (added < 0) {
        unreserve(e, b);
        if (REAL(cuDevicePrimaryCtxRelease_v2))
            REAL(cuDevicePrimaryCtxRelease_v2)(dev);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

/* After a release or a reset: the driver destroys the primary context when nothing retains
 * it any more; only then are its bytes given back (a state that cannot be read keeps them). */
static CUresult primary_released(CUresult r, CUdevice dev)
{
    unsigned int flags;
    int active = 1;
    if (r == CUDA_SUCCESS && budget_mode() != MODE_OFF && drv.cuDevicePrimaryCtxGetState &&
        drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active)
        forget(K_PRIMARY, (uint64_t)dev);
    return r;
}

/* Release, reset and destroy: after the driver's call, `then` gives back what it released. */
#define RELEASE_HOOK(name, type, then)                                  \
    EXPORT CUresult CUDAAPI name(type x)                                \
    {                                                                   \
        CU_READY();                                                     \
        REAL_OR_FAIL(name);                                             \
        return then(REAL(name)(x), x);                                  \
    }
RELEASE_HOOK(cuDevicePrimaryCtxRelease_v2, CUdevice, primary_released)
RELEASE_HOOK(cuDevicePrimaryCtxRelease, CUdevice, primary_released)
RELEASE_HOOK(cuDevicePrimaryCtxReset_v2, CUdevice, primary_released)
RELEASE_HOOK(cuDevicePrimaryCtxReset, CUdevice, primary_released)

/* ---- contexts of their own: cuCtxCreate in its three current signatures ---- */
struct a_ctx {
    CUcontext *pctx;
    unsigned int flags;
    CUdevice dev;
    CUexecAffinityParam *aff;
    int naff;
    CUctxCreateParams *params;
};
static CUresult call_ctx2(void *x) { struct a_ctx *a = x; return REAL(cuCtxCreate_v2)(a->pctx, a->flags, a->dev); }
static CUresult call_ctx3(void *x)
{
    struct a_ctx *a = x;
    return REAL(cuCtxCreate_v3)(a->pctx, a->aff, a->naff, a->flags, a->dev);
}
static CUresult call_ctx4(void *x) { struct a_ctx *a = x; return REAL(cuCtxCreate_v4)(a->pctx, a->params, a->flags, a->dev); }
static uint64_t key_ctx(void *x) { return (uint64_t)(uintptr_t)*((struct a_ctx *)x)->pctx; }
static void undo_ctx(void *x)
{
    if (REAL(cuCtxDestroy_v2))
        REAL(cuCtxDestroy_v2)(*((struct a_ctx *)x)->pctx);
}
static const struct counted PATH_CTX2 = {K_CTX, call_ctx2, key_ctx, undo_ctx};
static const struct counted PATH_CTX3 = {K_CTX, call_ctx3, key_ctx, undo_ctx};
static const struct counted PATH_CTX4 = {K_CTX, call_ctx4, key_ctx, undo_ctx};

/* Like counted_alloc, with what a context on `dev` holds as the bytes. */
static CUresult ctx_create(const struct counted *c, struct a_ctx *a)
{
    int e;
    uint64_t b;
    if (!a->pctx)
        return c->call(a);
    CUresult r = ctx_reserve(a->dev, &e, &b);
    return r != CUDA_SUCCESS ? r : counted_call(c, a, e, b);
}

EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuCtxCreate_v2);
    struct a_ctx a = {pctx, flags, dev, NULL, 0, NULL};
    return ctx_create(&PATH_CTX2, &a);
}
EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *aff, int naff,
                                      unsigned int flags, CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuCtxCreate_v3);
    struct a_ctx a = {pctx, flags, dev, aff, naff, NULL};
    return ctx_create(&PATH_CTX3, &a);
}
EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                      CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuCtxCreate_v4);
    struct a_ctx a = {pctx, flags, dev, NULL, 0, params};
    return ctx_create(&PATH_CTX4, &a);
}

/* The pre-3.2 entry point: refused, as the other legacy ones are. */
EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)pctx;
    (void)flags;
    (void)dev;
    LEGACY_REFUSE(cuCtxCreate);
}

static CUresult ctx_destroyed(CUresult r, CUcontext c)
{
    if (r == CUDA_SUCCESS && c)
        forget(K_CTX, (uint64_t)(uintptr_t)c);
    return r;
}
RELEASE_HOOK(cuCtxDestroy_v2, CUcontext, ctx_destroyed)
RELEASE_HOOK(cuCtxDestroy, CUcontext, ctx_destroyed)
