/* libtessera: what each object this process created holds -- allocation, handle, array,
 * context, graph exec -- in an open-addressing hash table keyed by (kind, key), guarded by
 * an in-process spinlock held for a few hundred instructions at most (never across a driver
 * call).  The table grows by doubling; an entry that cannot be added is refused to the
 * caller, which then gives the object back to the driver: nothing is held uncounted. */
#include "records.h"

#include <stdlib.h>

static struct rec *recs;
static size_t recs_cap, recs_used;
static int recs_mu; /* spinlock: held for a few hundred instructions at most */

static inline void recs_lock(void) { spin_lock(&recs_mu); }
static inline void recs_unlock(void) { spin_unlock(&recs_mu); }

void records_reset_child(void)
{
    recs_mu = 0;
    free(recs);
    recs = NULL;
    recs_cap = recs_used = 0;
}

static size_t rhash(uint64_t k, uint8_t kind)
{
    k ^= (uint64_t)kind * 0x9e3779b97f4a7c15ull;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static int recs_grow_locked(void)
{
    size_t ncap = recs_cap ? recs_cap * 2 : 16384; /* 384 KiB, touched lazily */
    struct rec *n = calloc(ncap, sizeof *n);
    if (!n)
        return -1;
    size_t used = 0;
    for (size_t i = 0; i < recs_cap; i++) {
        if (recs[i].kind == 0 || recs[i].kind == 0xff)
            continue;
        size_t j = rhash(recs[i].key, recs[i].kind) & (ncap - 1);
        while (n[j].kind)
            j = (j + 1) & (ncap - 1);
        n[j] = recs[i];
        used++;
    }
    free(recs);
    recs = n;
    recs_cap = ncap;
    recs_used = used;
    return 0;
}

/* With the lock held and room made (rec_room_locked): the slot of (kind, key), or the one it
 * goes into (*added = 1). */
static inline int rec_room_locked(void)
{
    return (recs_used + 1) * 2 <= recs_cap || recs_grow_locked() == 0;
}
static inline __attribute__((always_inline)) size_t rec_slot_locked(uint8_t kind, uint64_t key,
                                                                     int *added)
{
    size_t j = rhash(key, kind) & (recs_cap - 1), tomb = SIZE_MAX;
    while (recs[j].kind) {
        if (recs[j].kind == kind && recs[j].key == key)
            break;
        if (recs[j].kind == 0xff && tomb == SIZE_MAX)
            tomb = j;
        j = (j + 1) & (recs_cap - 1);
    }
    *added = !recs[j].kind;
    if (*added) {
        if (tomb != SIZE_MAX)
            j = tomb;
        else
            recs_used++;
    }
    return j;
}

int rec_put(uint8_t kind, uint64_t key, int entry, uint64_t bytes)
{
    int added;
    recs_lock();
    if (UNLIKELY(!rec_room_locked())) {
        recs_unlock();
        return -1;
    }
    struct rec *r = &recs[rec_slot_locked(kind, key, &added)];
    r->key = key;
    r->bytes = bytes;
    r->entry = entry;
    r->kind = kind;
    recs_unlock();
    return 0;
}

int rec_add(const struct rec *r, int replace)
{
    int added = -1;
    recs_lock();
    if (rec_room_locked()) {
        size_t j = rec_slot_locked(r->kind, r->key, &added);
        if (added || replace)
            recs[j] = *r;
    }
    recs_unlock();
    return added;
}

int rec_get(uint8_t kind, uint64_t key, int take, struct rec *out)
{
    int found = 0;
    recs_lock();
    if (recs_cap) {
        size_t j = rhash(key, kind) & (recs_cap - 1);
        while (recs[j].kind) {
            if (recs[j].kind == kind && recs[j].key == key) {
                *out = recs[j];
                if (take)
                    recs[j].kind = 0xff;
                found = 1;
                break;
            }
            j = (j + 1) & (recs_cap - 1);
        }
    }
    recs_unlock();
    return found;
}
