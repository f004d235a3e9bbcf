/* libtessera: launch tokens (tokens.c).  A launch spends tokens (x1000) from the container's
 * bucket, a GCRA in the ledger whose rate and depth the budget sets.  Fast path: a relaxed
 * decrement of a process-local credit.  Slow path: take a batch from the shared bucket (one
 * CAS on tat_ns) and sleep until it conforms. */
#ifndef TESSERA_TOKENS_H
#define TESSERA_TOKENS_H

#include "budget_state.h"
#include "driver.h"
#include "ordinal.h"

#pragma GCC visibility push(hidden)

/* Process-local tokens (x1000) taken from the bucket and not spent yet, per entry. */
extern int64_t credit[TB_MAX_DEV];

/* The credit ran out: take `cost` tokens (and about 1 ms more) from the bucket, waiting
 * until they conform. */
void refill(int e, uint64_t cost) __attribute__((noinline));
/* In a fork child: the parent's credit is not the child's. */
void tokens_reset_child(void);

/* With several devices: the budget entry of the current context's device (0 without one). */
int launch_entry_multi(void) __attribute__((noinline));

/* Spend `kernels` tokens before a launch; waits when the bucket is empty. */
static inline __attribute__((always_inline)) void spend(uint64_t kernels)
{
    if (budget_mode() == MODE_OFF)
        return;
    budget_check();
    int e = budget_ndev() == 1 ? 0 : one_device() ? entry_of_ordinal(0) : launch_entry_multi();
    if (e < 0)
        return; /* a device outside the budget has no memory to run anything with */
    if (!(budget_flags(e) & TB_DEV_CORE_LIMIT))
        return;
    int64_t cost = (int64_t)kernels * 1000;
    if (UNLIKELY(__atomic_sub_fetch(&credit[e], cost, __ATOMIC_RELAXED) < 0))
        refill(e, (uint64_t)cost);
}

/* A kernel launch's fast path, inline in the hook and free of calls, so that the hook can
 * pass the launch on with a jump: true when this launch's `kernels` tokens are spent (or none
 * are owed) under the budget file of one entry `map` (budget_one_map()) whose generation has
 * not moved.  False, with nothing spent, in every other case: the hook then takes spend(),
 * which does it all the slow way (a reload, a refill). */
static inline __attribute__((always_inline)) int spend_fast(const volatile unsigned char *map,
                                                            uint64_t kernels)
{
    if (UNLIKELY(!budget_current(map)))
        return 0;
    if (!(budget_flags(0) & TB_DEV_CORE_LIMIT))
        return 1;
    int64_t cost = (int64_t)kernels * 1000;
    if (LIKELY(__atomic_sub_fetch(&credit[0], cost, __ATOMIC_RELAXED) >= 0))
        return 1;
    /* the credit ran out: given back, and spend() takes it again and refills */
    __atomic_add_fetch(&credit[0], cost, __ATOMIC_RELAXED);
    return 0;
}

#pragma GCC visibility pop
#endif
