/* libtessera: the counting step every allocation path shares (count.c): which budget entry
 * an allocation is counted on, the reservation in the ledger (check and reservation are one
 * step), the driver call, and the record that lets the free give the bytes back. */
#ifndef TESSERA_COUNT_H
#define TESSERA_COUNT_H

#include "budget_state.h"
#include "driver.h"
#include "ledger_attach.h"
#include "ordinal.h"
#include "records.h"

#pragma GCC visibility push(hidden)

/* Inside a driver call a hook makes (the driver may call hooked entry points itself): such
 * nested calls are not counted again. */
extern __thread int in_hook __attribute__((tls_model("initial-exec")));
#define ENTER() (in_hook++)
#define LEAVE() (in_hook--)

/* A reservation was refused: reclaim dead processes' slots and this process's trimmed pool
 * reserves, then try once more.  0 reserved, else refused. */
int reserve_retry(struct tl *l, int e, uint64_t bytes, uint64_t limit) __attribute__((noinline));

/* The budget entry of the device of the current context (*ord < 0, then set) or ordinal *ord.
 * CUDA_SUCCESS with *entry set (-1: untracked, pass through), or the error to return. */
static inline __attribute__((always_inline)) CUresult resolve_entry(int *ord, int *entry)
{
    *entry = -1;
    if (budget_mode() == MODE_OFF || in_hook)
        return CUDA_SUCCESS;
    if (*ord < 0) {
        /* One visible device: it is the current context's device (without a context the
         * driver call fails and the reservation is given back). */
        if (one_device()) {
            *ord = 0;
        } else {
            CUdevice d;
            if (!drv.cuCtxGetDevice || drv.cuCtxGetDevice(&d) != CUDA_SUCCESS)
                return CUDA_ERROR_INVALID_CONTEXT;
            *ord = d;
        }
    }
    budget_check();
    int e = entry_of_ordinal(*ord);
    if (e < 0) {
        LOG_ONCE("device %d is not in the budget: refusing its memory", *ord);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *entry = e;
    return CUDA_SUCCESS;
}

/* Reserve bytes on budget entry e (>= 0): check and reservation are one step. */
static inline __attribute__((always_inline)) CUresult reserve_entry(int e, uint64_t bytes)
{
    uint32_t f = budget_flags(e);
    uint64_t limit = (f & TB_DEV_MEM_LIMIT) ? budget_limit(e) : UINT64_MAX;
    struct tl *l = ledger_get();
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int r = tl_reserve(l, e, bytes, limit);
    if (UNLIKELY(r == 1))
        r = reserve_retry(l, e, bytes, limit);
    if (UNLIKELY(r < 0))
        LOG_ONCE("ledger %s unusable (its counts or header were written from inside the "
                 "container, or its lock is held): refusing device memory", TB_LEDGER_PATH);
    return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

/* Reserve bytes for the device of the current context (ord < 0) or ordinal ord.
 * CUDA_SUCCESS with *entry set (-1: untracked, pass through), or the error to return. */
static inline __attribute__((always_inline)) CUresult reserve(int ord, uint64_t bytes, int *entry)
{
    int e;
    CUresult r = resolve_entry(&ord, &e);
    if (r != CUDA_SUCCESS || e < 0) {
        *entry = -1;
        return r;
    }
    r = reserve_entry(e, bytes);
    *entry = r == CUDA_SUCCESS ? e : -1;
    return r;
}

/* After a successful driver call: remember what it holds; on failure undo everything. */
static inline int remember(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    if (entry < 0)
        return 0;
    if (rec_put(kind, key, entry, bytes)) {
        unreserve(entry, bytes);
        return -1;
    }
    return 0;
}

/* After a successful free: give back what the object held. */
static inline void forget(uint8_t kind, uint64_t key)
{
    struct rec r;
    if (rec_get(kind, key, 1, &r))
        unreserve(r.entry, r.bytes);
}

/* The one counted-allocation step every path shares: reserve the bytes, call the driver,
 * give them back if it fails, then remember the object so that its free returns them.  If
 * the table of live objects is full, the object goes back to the driver and the caller sees
 * OUT_OF_MEMORY: nothing is ever held uncounted.  `arg` is the path's argument struct. */
struct counted {
    uint8_t kind;
    CUresult (*call)(void *arg);  /* the driver call that creates the object */
    uint64_t (*key)(void *arg);   /* the created object's key (read after success) */
    void (*undo)(void *arg);      /* destroy the created object */
};

/* The driver call and what follows it, with `bytes` already reserved on entry e (-1: none). */
static inline __attribute__((always_inline)) CUresult
counted_call(const struct counted *c, void *arg, int e, uint64_t bytes)
{
    CUresult r;
    ENTER();
    r = c->call(arg);
    LEAVE();
    if (r != CUDA_SUCCESS) {
        unreserve(e, bytes);
        return r;
    }
    if (remember(c->kind, c->key(arg), e, bytes)) {
        c->undo(arg);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static inline __attribute__((always_inline)) CUresult
counted_alloc(const struct counted *c, void *arg, int ord, uint64_t bytes)
{
    int e;
    CUresult r = reserve(ord, bytes, &e);
    if (r != CUDA_SUCCESS)
        return r;
    return counted_call(c, arg, e, bytes);
}

/* Device-pointer paths: every argument struct starts with the CUdeviceptr * it fills. */
static inline uint64_t key_ptr(void *a) { return (uint64_t)**(CUdeviceptr **)a; }

#pragma GCC visibility pop
#endif
