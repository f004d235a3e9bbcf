/* tjoin: join a ledger and stay (bench/hook.py: the cost of the Nth process joining).
 *   tjoin LEDGER SECS   join, print "joined <slot>", sleep SECS */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../src/ledger.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    struct tl l;
    const char *why = "";
    if (tl_open(&l, argv[1], &why) || tl_join(&l, &why)) {
        fprintf(stderr, "tjoin: %s\n", why);
        return 1;
    }
    printf("joined %d\n", l.slot);
    fflush(stdout);
    usleep((useconds_t)(atof(argv[2]) * 1e6));
    return 0;
}
