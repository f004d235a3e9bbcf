/* libtessera: which budget entry a CUDA ordinal is (ordinal.c).  Matched by UUID or by index,
 * as the entry says, and kept until the budget's generation moves. */
#ifndef TESSERA_ORDINAL_H
#define TESSERA_ORDINAL_H

#include "budget_state.h"
#include "driver.h"

#pragma GCC visibility push(hidden)

#define MAX_ORD 64

/* Private to ordinal.c: use the functions below. */
struct ordinal_map {
    int entry[MAX_ORD];  /* CUDA ordinal -> entry, -2 unknown, -1 none */
    uint64_t gen;        /* the budget generation entry[] was found for */
    int ndevices;        /* devices the driver shows, -1 not asked yet */
};
extern struct ordinal_map ordinal_map;

/* Every ordinal unknown (on first use). */
void ordinal_start(void);
int entry_of_ordinal_slow(int ord, uint64_t g) __attribute__((noinline));

/* Budget entry of a CUDA ordinal: -1 when the budget names no such device. */
static inline int entry_of_ordinal(int ord)
{
    if (UNLIKELY(ord < 0 || ord >= MAX_ORD))
        return -1;
    uint64_t g = budget_gen();
    if (LIKELY(g == __atomic_load_n(&ordinal_map.gen, __ATOMIC_RELAXED))) {
        int e = __atomic_load_n(&ordinal_map.entry[ord], __ATOMIC_RELAXED);
        if (LIKELY(e != -2))
            return e;
    }
    return entry_of_ordinal_slow(ord, g);
}

/* Does the driver show exactly one device (then it is every context's)? */
static inline int one_device(void)
{
    int n = __atomic_load_n(&ordinal_map.ndevices, __ATOMIC_RELAXED);
    if (UNLIKELY(n < 0)) {
        int c = 0;
        if (!drv.cuDeviceGetCount || drv.cuDeviceGetCount(&c) != CUDA_SUCCESS)
            return 0; /* not initialised yet: ask every time */
        __atomic_store_n(&ordinal_map.ndevices, c, __ATOMIC_RELAXED);
        n = c;
    }
    return n == 1;
}

#pragma GCC visibility pop
#endif
