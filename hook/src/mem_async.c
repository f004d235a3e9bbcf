/* libtessera: the stream-ordered allocator's paths: cuMemAllocAsync and
 * cuMemAllocFromPoolAsync (and their per-thread-stream twins), cuMemFreeAsync, cuMemPoolTrimTo
 * and cuMemPoolDestroy.  What each pool keeps reserved after frees is counted (pools.h): an
 * allocation is paid for first from what its pool keeps, a free leaves its bytes counted as
 * kept by the pool. */
#include "count.h"
#include "pools.h"
#include "startup.h"

struct a_async {
    CUdeviceptr *p;
    size_t n;
    CUstream s;
    CUmemoryPool pool;
    CUresult (*free)(CUdeviceptr, CUstream);  /* the matching (per-thread or not) async free */
};
static void undo_async(void *a_)
{
    struct a_async *a = a_;
    if (a->free)
        a->free(*a->p, a->s);
}
static CUresult call_async(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocAsync)(a->p, a->n, a->s); }
static CUresult call_async_ptsz(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocAsync_ptsz)(a->p, a->n, a->s); }
static CUresult call_pool(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocFromPoolAsync)(a->p, a->n, a->pool, a->s); }
static CUresult call_pool_ptsz(void *a_) { struct a_async *a = a_; return REAL(cuMemAllocFromPoolAsync_ptsz)(a->p, a->n, a->pool, a->s); }
static const struct counted PATH_ASYNC = {K_PTR, call_async, key_ptr, undo_async};
static const struct counted PATH_ASYNC_PTSZ = {K_PTR, call_async_ptsz, key_ptr, undo_async};
static const struct counted PATH_POOL = {K_PTR, call_pool, key_ptr, undo_async};
static const struct counted PATH_POOL_PTSZ = {K_PTR, call_pool_ptsz, key_ptr, undo_async};

/* An allocation from a->pool (NULL: the device's current pool), counted on the device of the
 * current context.  A NULL pointer is the driver's to refuse. */
static CUresult pool_alloc(const struct counted *c, struct a_async *a)
{
    if (!a->p)
        return c->call(a);
    int ord = -1, e;
    CUresult r = resolve_entry(&ord, &e);
    if (r != CUDA_SUCCESS || e < 0)
        return r != CUDA_SUCCESS ? r : counted_call(c, a, -1, 0);
    CUmemoryPool h = a->pool;
    if (!h && (!drv.cuDeviceGetMemPool || drv.cuDeviceGetMemPool(&h, ord) != CUDA_SUCCESS))
        h = NULL;
    struct rec rc = {0, a->n, e, K_APTR, 0, 0};
    uint64_t took = h ? pool_take(h, e, a->n, &rc) : UINT64_MAX;
    if (took == UINT64_MAX) /* not tracked: counted as a plain allocation */
        return (r = reserve_entry(e, a->n)) != CUDA_SUCCESS ? r : counted_call(c, a, e, a->n);
    uint64_t need = a->n - took;
    if (need && (r = reserve_entry(e, need)) != CUDA_SUCCESS) {
        if (!pool_keep(&rc, e, took))
            unreserve(e, took);
        return r;
    }
    ENTER();
    r = c->call(a);
    LEAVE();
    if (r != CUDA_SUCCESS) {
        if (!pool_keep(&rc, e, took))
            unreserve(e, took);
        unreserve(e, need);
        return r;
    }
    rc.key = key_ptr(a);
    if (rec_add(&rc, 1) < 0) { /* nowhere to remember it: back into the pool, which keeps it */
        c->undo(a);
        if (!pool_keep(&rc, e, a->n))
            unreserve(e, a->n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pool_settle(h);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocAsync);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync)};
    return pool_alloc(&PATH_ASYNC, &a);
}
EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocAsync_ptsz);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync_ptsz)};
    return pool_alloc(&PATH_ASYNC_PTSZ, &a);
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync)};
    return pool ? pool_alloc(&PATH_POOL, &a) : call_pool(&a); /* NULL: the driver's to refuse */
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync_ptsz);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync_ptsz)};
    return pool ? pool_alloc(&PATH_POOL_PTSZ, &a) : call_pool_ptsz(&a); /* NULL: the driver's to refuse */
}

/* The freed bytes stay counted, as kept by their pool, until it is settled. */
static CUresult free_async(CUresult (*fn)(CUdeviceptr, CUstream), CUdeviceptr dptr, CUstream s)
{
    ENTER();
    CUresult r = fn(dptr, s);
    LEAVE();
    struct rec rc;
    if (r != CUDA_SUCCESS || !dptr)
        return r;
    if (rec_get(K_APTR, dptr, 1, &rc)) {
        if (!pool_keep(&rc, rc.entry, rc.bytes))
            unreserve(rc.entry, rc.bytes);
    } else {
        forget(K_PTR, dptr); /* an untracked pool's, or a plain allocation's */
    }
    return r;
}
EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemFreeAsync);
    return free_async(REAL(cuMemFreeAsync), dptr, s);
}
EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemFreeAsync_ptsz);
    return free_async(REAL(cuMemFreeAsync_ptsz), dptr, s);
}

EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    CU_READY();
    REAL_OR_FAIL(cuMemPoolTrimTo);
    CUresult r = REAL(cuMemPoolTrimTo)(pool, keep);
    if (r == CUDA_SUCCESS && budget_mode() != MODE_OFF)
        pool_settle(pool);
    return r;
}

/* A destroyed pool's reserve goes back to the device; its live allocations keep their bytes
 * until freed (they are counted as plain allocations from now on). */
EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    CU_READY();
    REAL_OR_FAIL(cuMemPoolDestroy);
    CUresult r = REAL(cuMemPoolDestroy)(pool);
    if (r == CUDA_SUCCESS && budget_mode() != MODE_OFF)
        pool_destroyed(pool);
    return r;
}
