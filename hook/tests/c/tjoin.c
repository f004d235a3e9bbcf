/* tjoin: join a ledger and stay (bench/hook.py: the cost of the Nth process joining).
 *   tjoin LEDGER SECS        join, print "joined <slot>", sleep SECS
 *   tjoin LEDGER die BYTES   join, take the ledger lock, record BYTES in the slot but not in
 *                            used[0] (mid-update), then SIGKILL itself while holding the lock */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../src/ledger.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    struct tl l;
    const char *why = "";
    if (tl_open(&l, argv[1], 0, 0, &why) || tl_join(&l, &why)) {
        fprintf(stderr, "tjoin: %s\n", why);
        return 1;
    }
    if (!strcmp(argv[2], "die") && argc > 3) {
        uint64_t want = ((uint64_t)(l.slot + 1) << 32) | l.self->gen, w = 0;
        if (!__atomic_compare_exchange_n(&l.h->lock, &w, want, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return 1;
        l.self->bytes[0] += strtoull(argv[3], NULL, 0); /* used[0] not yet updated */
        raise(SIGKILL);
    }
    printf("joined %d\n", l.slot);
    fflush(stdout);
    usleep((useconds_t)(atof(argv[2]) * 1e6));
    return 0;
}
