/* The container ledger: shared device-byte accounting and token buckets (formats.h). */
#ifndef TESSERA_LEDGER_H
#define TESSERA_LEDGER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "formats.h"

struct tl {
    int fd;                 /* our own open file description: holds our slot's OFD lock */
    struct tl_header *h;
    struct tl_slot *slots;
    struct tl_slot *self;   /* NULL until joined */
    int slot;
    uint64_t own[TB_MAX_DEV]; /* what this process holds, in its own memory: the shared
                                 counts are the container's to write, these are not */
};

/* Called with a ledger mapping's address as soon as it exists, before any access (libtessera
 * guards it against truncation by the container); NULL: nothing to call. */
extern void (*tl_on_map)(void *base);

/* Validate a mapped ledger header (pure; fuzzed).  0 ok, -1 with *why. */
int tl_validate(const void *map, size_t len, const char **why);

/* Open and map the ledger.  want_ino != 0: the ledger the node daemon created, as the budget
 * file names it (device want_dev, inode want_ino): a regular file of the ledger's size that
 * is exactly that one, never created, initialised or replaced here.  want_ino == 0 (no
 * daemon: the environment fallback): created and initialised when needed.  0, or -1 with
 * *why. */
int tl_open(struct tl *l, const char *path, uint64_t want_dev, uint64_t want_ino,
            const char **why);
/* Claim a slot: O(1) expected (probe from pid % nslots; a dead owner's slot is reclaimed). */
int tl_join(struct tl *l, const char **why);
/* Forget the mapping and descriptor without touching shared state (fork child). */
void tl_forget(struct tl *l);

/* Reserve bytes on budget entry dev against limit: the check and the reservation are one
 * step under the ledger lock.  A shared count below what this process holds itself, or a
 * header without its magic, is a ledger the container wrote: unusable (a container that
 * zeroes its ledger does not give its running processes their budget again).  0 reserved,
 * 1 over budget, -1 ledger unusable. */
int tl_reserve(struct tl *l, int dev, uint64_t bytes, uint64_t limit);
void tl_release(struct tl *l, int dev, uint64_t bytes);
/* Reclaim the slots of dead processes.  Returns how many. */
int tl_reap(struct tl *l);

#endif
