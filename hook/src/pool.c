/* libtessera: the stream-ordered allocator.  cuMemFreeAsync does not give memory back to the
 * device: the pool keeps it reserved (and serves later allocations from it) until a
 * synchronisation trims it down to its release threshold, or cuMemPoolTrimTo, or the pool's
 * destruction.  So a pool's count is its live allocations plus what it keeps:
 *
 *   allocation of n from pool P: what P keeps pays for it first, only the rest is reserved;
 *   free: the n bytes stay counted, as kept by P;
 *   settle P: kept := what the driver says P holds beyond its live allocations
 *     (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT - CU_MEMPOOL_ATTR_USED_MEM_CURRENT), giving back
 *     what a trim released and charging what the pool took beyond the requests.
 *
 * P is settled after each of its allocations, at cuMemPoolTrimTo, in every memory view and
 * before a refusal stands.  Between a synchronisation that trims a pool and the next of
 * these, the trimmed bytes still count: the count errs high, never low. */
#include "hook.h"

#include <sched.h>
#include <string.h>

#define MAX_POOLS 64 /* pools beyond these are counted as plain allocations */

struct pool {
    uint64_t h;       /* the CUmemoryPool, 0: free */
    int entry;        /* the budget entry its bytes are counted on */
    uint16_t gen;     /* bumped whenever the slot takes a pool: records name (slot, gen) */
    uint64_t kept;    /* bytes counted for what it keeps reserved beyond live allocations */
    uint64_t version; /* bumped by every change of kept */
};
static struct pool pools[MAX_POOLS];
static int pools_mu; /* in-process spinlock, never held across a driver call */

static void pools_lock(void)
{
    for (unsigned spins = 0; __atomic_exchange_n(&pools_mu, 1, __ATOMIC_ACQUIRE); spins++) {
        if (spins > 100)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}
static void pools_unlock(void) { __atomic_store_n(&pools_mu, 0, __ATOMIC_RELEASE); }

void th_pools_reset_child(void)
{
    pools_mu = 0;
    memset(pools, 0, sizeof pools);
}

static struct pool *find_locked(CUmemoryPool h)
{
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].h == (uint64_t)(uintptr_t)h)
            return &pools[i];
    return NULL;
}

/* Take up to n of what P keeps for an allocation counted on entry e (registering P on its
 * first use); *rc names P's slot.  Returns the bytes taken, or UINT64_MAX when P is not
 * tracked. */
static uint64_t pool_take(CUmemoryPool h, int e, uint64_t n, struct rec *rc)
{
    uint64_t took = UINT64_MAX;
    pools_lock();
    struct pool *p = find_locked(h);
    if (!p && (p = find_locked(NULL)) != NULL) {
        p->h = (uint64_t)(uintptr_t)h;
        p->entry = e;
        p->gen = (p->gen + 1) & 511;
        p->kept = 0;
        p->version++;
    }
    if (p && p->entry == e) {
        took = p->kept < n ? p->kept : n;
        p->kept -= took;
        p->version++;
        rc->pool = (uint16_t)((p - pools + 1) | (p->gen << 7));
    }
    pools_unlock();
    return took;
}

/* n bytes counted on entry e are kept by the pool rc names now.  0 when that pool is not
 * tracked (any more): then they are the caller's to give back. */
static int pool_keep(const struct rec *rc, int e, uint64_t n)
{
    int ok = 0;
    pools_lock();
    struct pool *p = rc->pool ? &pools[(rc->pool & 127) - 1] : NULL;
    if (p && p->h && p->gen == rc->pool >> 7 && p->entry == e) {
        p->kept += n;
        p->version++;
        ok = 1;
    }
    pools_unlock();
    return ok;
}

/* Re-read what P keeps from the driver; returns the bytes given back. */
static uint64_t pool_settle(CUmemoryPool h)
{
    cuuint64_t reserved = 0, used = 0;
    pools_lock();
    struct pool *p = find_locked(h);
    uint64_t version = p ? p->version : 0;
    pools_unlock();
    if (!p || !r_cuMemPoolGetAttribute ||
        r_cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
        r_cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
        return 0; /* unknown: what is counted stays counted */
    uint64_t now = reserved > used ? reserved - used : 0, was = 0;
    int e = -1;
    pools_lock();
    if (p->h == (uint64_t)(uintptr_t)h && p->version == version) { /* no alloc/free meanwhile */
        was = p->kept;
        e = p->entry;
        p->kept = now;
        p->version++;
    }
    pools_unlock();
    if (e < 0 || now == was)
        return 0;
    if (now < was) {
        unreserve(e, was - now);
        return was - now;
    }
    /* the pool took more than was asked (its granularity): held, so counted, over the limit
     * if need be -- later allocations are refused until it is given back */
    struct tl *l = ledger_get();
    if (l)
        tl_reserve(l, e, now - was, UINT64_MAX);
    return 0;
}

uint64_t pools_settle_all(void)
{
    CUmemoryPool hs[MAX_POOLS];
    int n = 0;
    pools_lock();
    for (int i = 0; i < MAX_POOLS; i++)
        if (pools[i].h)
            hs[n++] = (CUmemoryPool)(uintptr_t)pools[i].h;
    pools_unlock();
    uint64_t back = 0;
    for (int i = 0; i < n; i++)
        back += pool_settle(hs[i]);
    return back;
}

int reserve_retry(struct tl *l, int e, uint64_t bytes, uint64_t limit)
{
    int reaped = tl_reap(l) > 0;
    if (pools_settle_all() > 0 || reaped)
        return tl_reserve(l, e, bytes, limit);
    return 1;
}

/* ---- the allocation and free paths ---- */
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
 * current context. */
static CUresult pool_alloc(const struct counted *c, struct a_async *a)
{
    int ord = -1, e;
    CUresult r = resolve_entry(&ord, &e);
    if (r != CUDA_SUCCESS || e < 0)
        return r != CUDA_SUCCESS ? r : counted_call(c, a, -1, 0);
    CUmemoryPool h = a->pool;
    if (!h && (!r_cuDeviceGetMemPool || r_cuDeviceGetMemPool(&h, ord) != CUDA_SUCCESS))
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
    if (!dptr)
        return REAL(cuMemAllocAsync)(dptr, n, s);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync)};
    return pool_alloc(&PATH_ASYNC, &a);
}
EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocAsync_ptsz);
    if (!dptr)
        return REAL(cuMemAllocAsync_ptsz)(dptr, n, s);
    struct a_async a = {dptr, n, s, NULL, REAL(cuMemFreeAsync_ptsz)};
    return pool_alloc(&PATH_ASYNC_PTSZ, &a);
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync);
    if (!dptr || !pool)
        return REAL(cuMemAllocFromPoolAsync)(dptr, n, pool, s);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync)};
    return pool_alloc(&PATH_POOL, &a);
}
EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool pool, CUstream s)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocFromPoolAsync_ptsz);
    if (!dptr || !pool)
        return REAL(cuMemAllocFromPoolAsync_ptsz)(dptr, n, pool, s);
    struct a_async a = {dptr, n, s, pool, REAL(cuMemFreeAsync_ptsz)};
    return pool_alloc(&PATH_POOL_PTSZ, &a);
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
    if (r == CUDA_SUCCESS && mode != MODE_OFF)
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
    if (r != CUDA_SUCCESS || mode == MODE_OFF)
        return r;
    uint64_t kept = 0;
    int e = -1;
    pools_lock();
    struct pool *p = find_locked(pool);
    if (p) {
        kept = p->kept;
        e = p->entry;
        p->h = 0; /* its generation stays: records of its allocations no longer match */
        p->kept = 0;
        p->version++;
    }
    pools_unlock();
    unreserve(e, kept);
    return r;
}
