/* libtessera: what each memory pool of this process keeps reserved (pools.c).
 * cuMemFreeAsync does not give memory back to the device: the pool keeps it reserved (and
 * serves later allocations from it) until a synchronisation trims it down to its release
 * threshold, or cuMemPoolTrimTo, or the pool's destruction.  So a pool's count is its live
 * allocations plus what it keeps:
 *
 *   allocation of n from pool P: what P keeps pays for it first, only the rest is reserved;
 *   free: the n bytes stay counted, as kept by P;
 *   settle P: kept := what the driver says P holds beyond its live allocations
 *     (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT - CU_MEMPOOL_ATTR_USED_MEM_CURRENT), giving back
 *     what a trim released and charging what the pool took beyond the requests.
 *
 * P is settled after each of its allocations, at cuMemPoolTrimTo, in every memory view and
 * before a refusal stands.  Between a synchronisation that trims a pool and the next of
 * these, the trimmed bytes still count: the count errs high, never low.  The allocation and
 * free paths themselves are in mem_async.c. */
#ifndef TESSERA_POOLS_H
#define TESSERA_POOLS_H

#include "records.h"

#pragma GCC visibility push(hidden)

/* Take up to n of what P keeps for an allocation counted on entry e (registering P on its
 * first use); rc->pool names P's slot.  Returns the bytes taken, or UINT64_MAX when P is not
 * tracked. */
uint64_t pool_take(CUmemoryPool h, int e, uint64_t n, struct rec *rc);
/* n bytes counted on entry e are kept by the pool rc names now.  0 when that pool is not
 * tracked (any more): then they are the caller's to give back. */
int pool_keep(const struct rec *rc, int e, uint64_t n);
/* Re-read what P keeps from the driver; returns the bytes given back. */
uint64_t pool_settle(CUmemoryPool h);
/* Re-read every pool: the bytes given back. */
uint64_t pools_settle_all(void);
/* P was destroyed: what it kept goes back; its live allocations keep their bytes until freed
 * (counted as plain allocations from now on). */
void pool_destroyed(CUmemoryPool h);
/* In a fork child: the parent's pools are not the child's. */
void pools_reset_child(void);

#pragma GCC visibility pop
#endif
