/* libtessera: this process's place in its container's ledger (ledger_attach.c).  Opened and
 * joined on the first reservation, forgotten in a fork child, lost (refusing device memory)
 * when the container truncates it under the process. */
#ifndef TESSERA_LEDGER_ATTACH_H
#define TESSERA_LEDGER_ATTACH_H

#include "hook.h"
#include "ledger.h"

#pragma GCC visibility push(hidden)

/* Private to ledger_attach.c: use the functions below. */
struct ledger_attach {
    struct tl tl;
    int state;     /* 0 not tried, 1 joined, -1 unusable */
    int lost;      /* a SIGBUS in its mapping replaced it with private zeros */
};
extern struct ledger_attach ledger_attach;

/* The joined ledger, joining it on the first call; NULL: unusable (refuse device memory). */
struct tl *ledger_get(void);
/* The same, or after a loss its private zeros (what this process held, its own bucket). */
struct tl *ledger_or_lost(void);
/* In a fork child: the child holds no slot of its own yet. */
void ledger_reset_child(void);

/* Where this process counts its kernel launches: its ledger slot once joined, until then (or
 * when it cannot join) a private one nobody reads.  Never NULL, so the launch fast path
 * counts with one load and one add. */
extern struct tl_slot *launch_counter;
extern struct tl_slot launch_counter_private;

/* `kernels` launched, counted where launch_counter points (the node daemon's activity
 * signal): a plain add to memory only this process writes; an increment lost between two
 * of its threads is harmless (the count has only to move). */
static inline __attribute__((always_inline)) void count_launches_fast(uint64_t kernels)
{
    volatile uint64_t *n = &__atomic_load_n(&launch_counter, __ATOMIC_RELAXED)->launches;
    *n += kernels;
}

/* Join the ledger now if this process has not tried yet (under a budget): at its first
 * context (ctx.c) and its first slow launch, so that a process launching before it
 * allocates is counted too. */
void ledger_join_early(void);
/* count_launches_fast() on a slow path, joining the ledger first where not tried yet. */
void count_launches(uint64_t kernels);

/* Give back bytes reserved on budget entry `entry` (-1: nothing was reserved). */
static inline void unreserve(int entry, uint64_t bytes)
{
    if (entry >= 0 && bytes && ledger_attach.state == 1)
        tl_release(&ledger_attach.tl, entry, bytes);
}

#pragma GCC visibility pop
#endif
