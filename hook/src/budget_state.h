/* libtessera: the budget in force (budget_state.c).  Where it comes from (the budget file, or
 * without one the environment), its values per budget entry, and the check every hot path
 * makes: one load of the file's generation and a compare while nothing changed. */
#ifndef TESSERA_BUDGET_STATE_H
#define TESSERA_BUDGET_STATE_H

#include "budget.h"
#include "formats.h"
#include "hook.h"

#pragma GCC visibility push(hidden)

enum { MODE_OFF, MODE_FILE, MODE_ENV }; /* no budget; the budget file; the environment */

/* The budget in force, private to budget_state.c: read it through the functions below.
 * Each is read without a lock and is atomic on its own.  (Separate symbols rather than one
 * struct: GCC would keep a struct's base in a register across the launch paths, which then
 * save one more register on every call.) */
extern int bs_mode;                           /* MODE_* */
extern const volatile unsigned char *bs_map;  /* the budget file's mapping (MODE_FILE) */
extern const volatile unsigned char *bs_one_map; /* bs_map while ndev is 1, else NULL */
extern uint64_t bs_gen;                       /* the generation the values below reflect */
extern uint32_t bs_ndev;
extern uint32_t bs_flags[TB_MAX_DEV];         /* TB_DEV_* */
extern uint64_t bs_limit[TB_MAX_DEV];         /* bytes */
extern uint64_t bs_rate[TB_MAX_DEV];          /* tokens/s x 1000 */
extern uint64_t bs_burst[TB_MAX_DEV];         /* tokens x 1000 */
extern uint64_t bs_ctx[TB_MAX_DEV];           /* bytes one context holds */
extern uint8_t bs_uuid[TB_MAX_DEV][16];
extern uint32_t bs_index[TB_MAX_DEV];

/* Read the budget file (or the environment) the first time; waits for a pending file. */
void budget_start(void);
/* The generation moved: copy the file out again and validate it. */
void budget_reload(void) __attribute__((noinline));
/* In a fork child: the reload lock may have been held by another thread. */
void budget_reset_child(void);
/* The ledger the budget file names (0, 0: none named, or no budget file). */
void budget_ledger(uint64_t *dev, uint64_t *ino);

static inline int budget_mode(void) { return bs_mode; }

/* Every check: one load and a compare when nothing changed. */
static inline void budget_check(void)
{
    if (bs_mode == MODE_FILE && LIKELY(bs_map != NULL)) {
        uint64_t g = __atomic_load_n((const volatile uint64_t *)(bs_map + 8),
                                     __ATOMIC_ACQUIRE);
        if (UNLIKELY(g != __atomic_load_n(&bs_gen, __ATOMIC_RELAXED)))
            budget_reload();
    }
}

/* The launch fast path's one load: the budget file's mapping while the budget in force came
 * from it and has exactly one entry (NULL otherwise, and before the first read). */
static inline const volatile unsigned char *budget_one_map(void)
{
    return __atomic_load_n(&bs_one_map, __ATOMIC_ACQUIRE);
}
/* Is the budget in force the file's current generation (`map` from budget_one_map())? */
static inline int budget_current(const volatile unsigned char *map)
{
    return __atomic_load_n((const volatile uint64_t *)(map + 8), __ATOMIC_ACQUIRE) ==
           __atomic_load_n(&bs_gen, __ATOMIC_RELAXED);
}
/* The generation in force (acquire: the values below are at least as new). */
static inline uint64_t budget_gen(void)
{
    return __atomic_load_n(&bs_gen, __ATOMIC_ACQUIRE);
}

/* The entries of the budget in force, and each entry's values. */
#define BUDGET_LOAD(field, e) __atomic_load_n(&bs_##field[e], __ATOMIC_RELAXED)
static inline uint32_t budget_ndev(void) { return bs_ndev; }
static inline uint32_t budget_flags(int e) { return BUDGET_LOAD(flags, e); }
static inline uint64_t budget_limit(int e) { return BUDGET_LOAD(limit, e); }
static inline uint64_t budget_rate(int e) { return BUDGET_LOAD(rate, e); }
static inline uint64_t budget_burst(int e) { return BUDGET_LOAD(burst, e); }
static inline uint64_t budget_context_bytes(int e) { return BUDGET_LOAD(ctx, e); }
static inline const uint8_t *budget_uuid(int e) { return bs_uuid[e]; }
static inline uint32_t budget_index(int e) { return bs_index[e]; }

#pragma GCC visibility pop
#endif
