/* libtessera: the counting step's out-of-line parts (see count.h). */
#include "count.h"

#include "pools.h"

__thread int in_hook __attribute__((tls_model("initial-exec")));

int reserve_retry(struct tl *l, int e, uint64_t bytes, uint64_t limit)
{
    int reaped = tl_reap(l) > 0;
    if (pools_settle_all() > 0 || reaped)
        return tl_reserve(l, e, bytes, limit);
    return 1;
}
