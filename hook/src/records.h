/* libtessera: what each object this process created holds (records.c): a process-local table
 * keyed by (kind, pointer/handle), so that a free gives back exactly what its allocation
 * reserved. */
#ifndef TESSERA_RECORDS_H
#define TESSERA_RECORDS_H

#include "hook.h"

#pragma GCC visibility push(hidden)

enum { K_PTR = 1, K_APTR, K_HANDLE, K_ARRAY, K_MIPMAP, K_GEXEC, K_CTX, K_PRIMARY };
struct rec {
    uint64_t key;
    uint64_t bytes;
    int32_t entry;
    uint8_t kind;      /* 0 empty, 0xff tombstone */
    uint8_t reserved;
    uint16_t pool;     /* K_APTR (from a tracked memory pool, pools.c): its slot + 1 and, from
                          bit 7, that slot's generation then.  Not set for other kinds */
};
/* Add a record; one with the same kind and key is replaced when `replace`, else kept.
 * 1 added, 0 there already, -1 out of memory. */
int rec_add(const struct rec *r, int replace);
/* Add or replace a record (its `pool` is not set).  0, or -1 out of memory. */
int rec_put(uint8_t kind, uint64_t key, int entry, uint64_t bytes);
/* Find (and when take != 0, remove) a record.  1 found. */
int rec_get(uint8_t kind, uint64_t key, int take, struct rec *out);
/* In a fork child: the parent's objects are not the child's. */
void records_reset_child(void);

#pragma GCC visibility pop
#endif
