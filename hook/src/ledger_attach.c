/* libtessera: this process's place in its container's ledger.  The ledger the budget file
 * names (or, with the environment's budget, the one at TESSERA_LEDGER or a per-user path) is
 * opened and joined on the first reservation; a process that cannot join refuses device
 * memory.  A SIGBUS in the mapping (the container truncated the file) loses it: the process
 * goes on with private zeros and refuses device memory from then on. */
#include "ledger_attach.h"

#include "budget_state.h"
#include "guard.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct ledger_attach ledger_attach = {.tl = {.fd = -1, .slot = -1}};
struct tl_slot launch_counter_private;
struct tl_slot *launch_counter = &launch_counter_private;
static pthread_mutex_t ledger_mu = PTHREAD_MUTEX_INITIALIZER;

/* From the SIGBUS handler (guard.c): async-signal-safe. */
static void lost_now(void)
{
    __atomic_store_n(&ledger_attach.lost, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&ledger_attach.state, -1, __ATOMIC_RELEASE);
}

static void guard_mapping(void *base)
{
    guard_ledger(base, lost_now);
}

struct tl *ledger_get(void)
{
    struct ledger_attach *a = &ledger_attach;
    if (LIKELY(__atomic_load_n(&a->state, __ATOMIC_ACQUIRE) == 1))
        return &a->tl;
    pthread_mutex_lock(&ledger_mu);
    if (a->state == 0) {
        const char *why = "";
        const char *path = TB_LEDGER_PATH;
        char envpath[256];
        if (budget_mode() == MODE_ENV) {
            const char *p = getenv("TESSERA_LEDGER");
            if (p && *p)
                path = p;
            else {
                snprintf(envpath, sizeof envpath, "/tmp/tessera-ledger-%u", (unsigned)getuid());
                path = envpath;
            }
        }
        uint64_t dev, ino;
        budget_ledger(&dev, &ino);
        tl_on_map = guard_mapping; /* from its first access: a truncation is a loss */
        if (tl_open(&a->tl, path, dev, ino, &why) || tl_join(&a->tl, &why)) {
            th_log("ledger %s: %s: refusing device memory", path, why);
            guard_ledger(NULL, NULL);
            tl_forget(&a->tl);
            __atomic_store_n(&a->state, -1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&launch_counter, a->tl.self, __ATOMIC_RELEASE);
            int not_yet = 0; /* a SIGBUS meanwhile has made it -1: it stays so */
            __atomic_compare_exchange_n(&a->state, &not_yet, 1, 0, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED);
        }
    }
    if (__atomic_load_n(&a->lost, __ATOMIC_RELAXED))
        LOG_ONCE("ledger %s truncated under this process: refusing device memory from now on",
                 TB_LEDGER_PATH);
    pthread_mutex_unlock(&ledger_mu);
    return a->state == 1 ? &a->tl : NULL;
}

struct tl *ledger_or_lost(void)
{
    struct tl *l = ledger_get();
    if (!l && __atomic_load_n(&ledger_attach.lost, __ATOMIC_RELAXED))
        l = &ledger_attach.tl;
    return l;
}

void ledger_join_early(void)
{
    if (budget_mode() != MODE_OFF && __atomic_load_n(&ledger_attach.state, __ATOMIC_ACQUIRE) == 0)
        ledger_get(); /* joins, pointing launch_counter at its slot; or fails, and it stays */
}

void count_launches(uint64_t kernels)
{
    ledger_join_early();
    count_launches_fast(kernels);
}

void ledger_reset_child(void)
{
    struct ledger_attach *a = &ledger_attach;
    guard_ledger(NULL, NULL);
    if (a->tl.fd >= 0 || a->tl.h)
        tl_forget(&a->tl);
    a->state = a->lost ? -1 : 0; /* a child of a process that lost it: lost too */
    launch_counter = &launch_counter_private; /* the parent's slot is not the child's */
    pthread_mutex_init(&ledger_mu, NULL);
}
