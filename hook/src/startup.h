/* libtessera: a hook's first call in a process (startup.c).  Every CUDA hook starts with
 * CU_READY() (one load once started), every NVML hook with NVML_READY(): the driver's entry
 * points are resolved, the budget is read and the fork handler installed, once. */
#ifndef TESSERA_STARTUP_H
#define TESSERA_STARTUP_H

#include "driver.h"

#pragma GCC visibility push(hidden)

extern int cu_ready;
void cu_ready_slow(void) __attribute__((noinline));
#define CU_READY()                                              \
    do {                                                        \
        if (UNLIKELY(!__atomic_load_n(&cu_ready, __ATOMIC_ACQUIRE))) \
            cu_ready_slow();                                    \
    } while (0)

/* The budget (and what depends on it), once per process. */
extern pthread_once_t budget_once;
void budget_once_fn(void);
static inline void ensure_budget(void)
{
    pthread_once(&budget_once, budget_once_fn);
}

#define NVML_READY()                                \
    do {                                            \
        pthread_once(&nvml_once, nvml_init);        \
        ensure_budget();                            \
    } while (0)

#pragma GCC visibility pop
#endif
