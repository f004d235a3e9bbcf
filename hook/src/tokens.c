/* libtessera: launch tokens, the slow path (see tokens.h). */
#include "tokens.h"

#include "ledger_attach.h"

#include <errno.h>
#include <string.h>
#include <time.h>

int64_t credit[TB_MAX_DEV];

void tokens_reset_child(void)
{
    memset(credit, 0, sizeof credit);
}

int launch_entry_multi(void)
{
    CUdevice d;
    if (!drv.cuCtxGetDevice || drv.cuCtxGetDevice(&d) != CUDA_SUCCESS)
        return 0;
    int e = entry_of_ordinal(d);
    return e < 0 ? 0 : e;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

void refill(int e, uint64_t cost)
{
    struct tl *l = ledger_or_lost(); /* lost: its private zeros, a bucket of this process's own */
    uint64_t t0 = 0;
    for (;;) {
        budget_check();
        uint32_t f = budget_flags(e);
        if (!(f & TB_DEV_CORE_LIMIT) || !l) {
            __atomic_fetch_add(&credit[e], (int64_t)cost, __ATOMIC_RELAXED);
            return;
        }
        uint64_t rate = budget_rate(e);
        uint64_t burst = budget_burst(e);
        if (rate == 0) { /* the controller paused this container: re-check every 10 ms */
            if (!t0)
                t0 = mono_ns();
            sleep_ns(10000000);
            continue;
        }
        /* batch: ~1 ms worth of tokens, at least the cost of this launch */
        uint64_t batch = rate / 1000;
        uint64_t need = cost + (batch > 1000 ? batch - 1000 : 0);
        uint64_t need_ns = (uint64_t)((double)need * 1e9 / (double)rate);
        uint64_t burst_ns = (uint64_t)((double)burst * 1e9 / (double)rate);
        struct tl_dev *d = &l->h->dev[e];
        uint64_t now = mono_ns(), tat = __atomic_load_n(&d->tat_ns, __ATOMIC_RELAXED), ntat;
        do {
            ntat = (tat > now ? tat : now) + need_ns;
        } while (!__atomic_compare_exchange_n(&d->tat_ns, &tat, ntat, 1, __ATOMIC_RELAXED,
                                              __ATOMIC_RELAXED));
        __atomic_fetch_add(&d->tokens_milli, need, __ATOMIC_RELAXED);
        uint64_t go = ntat > burst_ns ? ntat - burst_ns : 0;
        if (go > now) {
            if (!t0)
                t0 = now;
            /* sleep in slices so a budget change is noticed */
            while (go > now) {
                uint64_t s = go - now;
                sleep_ns(s > 20000000 ? 20000000 : s);
                now = mono_ns();
            }
        }
        if (t0) {
            uint64_t w = mono_ns() - t0;
            __atomic_fetch_add(&d->wait_ns, w, __ATOMIC_RELAXED);
            __atomic_fetch_add(&d->waits, 1, __ATOMIC_RELAXED);
            uint64_t us = w / 1000;
            int b = us ? 64 - __builtin_clzll(us) : 0;
            __atomic_fetch_add(&l->h->wait_hist[e][b > 31 ? 31 : b], 1, __ATOMIC_RELAXED);
            if (l->self)
                l->self->wait_ns += w;
        }
        __atomic_fetch_add(&credit[e], (int64_t)need, __ATOMIC_RELAXED);
        return;
    }
}
