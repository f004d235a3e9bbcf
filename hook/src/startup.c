/* libtessera: a hook's first call in a process, and a fork.  The first call resolves the
 * driver's entry points and reads the budget; a fork child is a new process, which holds no
 * slot in the ledger, no records, pools or tokens of its parent's. */
#include "startup.h"

#include "budget_state.h"
#include "ledger_attach.h"
#include "ordinal.h"
#include "pools.h"
#include "records.h"
#include "tokens.h"

int cu_ready;
pthread_once_t budget_once = PTHREAD_ONCE_INIT;

void cu_ready_slow(void)
{
    pthread_once(&cu_once, cu_init);
    ensure_budget();
    __atomic_store_n(&cu_ready, 1, __ATOMIC_RELEASE);
}

static void atfork_child(void)
{
    ledger_reset_child();
    budget_reset_child();
    tokens_reset_child();
    records_reset_child();
    pools_reset_child();
}

void budget_once_fn(void)
{
    budget_start();
    ordinal_start();
    pthread_atfork(NULL, NULL, atfork_child);
}
