/* libtessera: what each memory pool of this process keeps reserved (see pools.h). */
#include "pools.h"

#include "driver.h"
#include "ledger_attach.h"

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
static int pools_mu; /* spinlock, never held across a driver call */

static void pools_lock(void) { spin_lock(&pools_mu); }
static void pools_unlock(void) { spin_unlock(&pools_mu); }

void pools_reset_child(void)
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

uint64_t pool_take(CUmemoryPool h, int e, uint64_t n, struct rec *rc)
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

int pool_keep(const struct rec *rc, int e, uint64_t n)
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

uint64_t pool_settle(CUmemoryPool h)
{
    cuuint64_t reserved = 0, used = 0;
    pools_lock();
    struct pool *p = find_locked(h);
    uint64_t version = p ? p->version : 0;
    pools_unlock();
    if (!p || !drv.cuMemPoolGetAttribute ||
        drv.cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) != CUDA_SUCCESS ||
        drv.cuMemPoolGetAttribute(h, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) != CUDA_SUCCESS)
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

void pool_destroyed(CUmemoryPool h)
{
    uint64_t kept = 0;
    int e = -1;
    pools_lock();
    struct pool *p = find_locked(h);
    if (p) {
        kept = p->kept;
        e = p->entry;
        p->h = 0; /* its generation stays: records of its allocations no longer match */
        p->kept = 0;
        p->version++;
    }
    pools_unlock();
    unreserve(e, kept);
}
