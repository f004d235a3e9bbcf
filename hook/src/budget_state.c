/* libtessera: the budget in force.  The budget file is mapped once; every check loads its
 * generation and compares it with the one in use, and only when it moved is the file copied
 * out (a torn copy is retried) and validated.  Without a budget file (and outside a
 * container tessera set up) the environment gives the budget.  A budget that cannot be read
 * refuses device memory. */
#include "budget_state.h"

#include "guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int bs_mode;
const volatile unsigned char *bs_map;
const volatile unsigned char *bs_one_map;
uint64_t bs_gen = UINT64_MAX;
uint32_t bs_ndev;
uint32_t bs_flags[TB_MAX_DEV];
uint64_t bs_limit[TB_MAX_DEV];
uint64_t bs_rate[TB_MAX_DEV];
uint64_t bs_burst[TB_MAX_DEV];
uint64_t bs_ctx[TB_MAX_DEV];
uint8_t bs_uuid[TB_MAX_DEV][16];
uint32_t bs_index[TB_MAX_DEV];

static size_t blen;
static pthread_mutex_t reload_mu = PTHREAD_MUTEX_INITIALIZER;
static int ever_valid;
static uint32_t cur_state;        /* header flags of the budget in force (TB_PENDING, ...) */
static uint32_t cur_wait_ms;
static uint64_t ledger_dev, ledger_ino; /* the daemon's ledger, as the budget names it */

static void apply_budget(const struct tb_budget *b)
{
    bs_ndev = b->ndev;
    for (uint32_t i = 0; i < TB_MAX_DEV; i++) {
        const struct tb_dev *d = &b->dev[i];
        int on = i < b->ndev;
        __atomic_store_n(&bs_limit[i], on ? d->mem_limit : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&bs_rate[i], on ? d->rate_milli : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&bs_burst[i], on ? d->burst_milli : 0, __ATOMIC_RELAXED);
        __atomic_store_n(&bs_ctx[i], on ? d->context_bytes : 0, __ATOMIC_RELAXED);
        memcpy(bs_uuid[i], d->uuid, 16);
        bs_index[i] = d->index;
        __atomic_store_n(&bs_flags[i], on ? d->flags : 0, __ATOMIC_RELAXED);
    }
}

/* No valid budget ever seen: memory is refused (limit 0), launches are not throttled. */
static void deny_all(void)
{
    struct tb_budget b;
    memset(&b, 0, sizeof b);
    b.ndev = TB_MAX_DEV;
    for (uint32_t i = 0; i < TB_MAX_DEV; i++) {
        b.dev[i].index = i;
        b.dev[i].flags = TB_DEV_MEM_LIMIT;
    }
    apply_budget(&b);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The first read of a mapped budget file.  A pending one (the daemon does not know this
 * container's pod yet) is waited for, at most the wait it names, in 10 ms steps; if it is
 * still pending then, device memory stays refused (limit 0) until the daemon writes it. */
static void budget_first_read(void)
{
    budget_reload();
    if (!(__atomic_load_n(&cur_state, __ATOMIC_RELAXED) & TB_PENDING))
        return;
    uint32_t wait = cur_wait_ms;
    uint64_t deadline = now_ms() + wait;
    const struct timespec step = {0, 10 * 1000 * 1000};
    while (now_ms() < deadline) {
        nanosleep(&step, NULL);
        budget_check();
        if (!(__atomic_load_n(&cur_state, __ATOMIC_RELAXED) & TB_PENDING))
            return;
    }
    th_log("budget not ready after %u ms (the node daemon does not know this container's pod "
           "yet): refusing GPU memory", wait);
}

/* No budget file: the environment's budget, or none at all. */
static void budget_from_env(void)
{
    const char *m = getenv("TESSERA_MEMORY_LIMIT"), *r = getenv("TESSERA_CORE_RATE"),
               *b = getenv("TESSERA_CORE_BURST");
    if ((!m || !*m) && (!r || !*r)) {
        bs_mode = MODE_OFF;
        return;
    }
    struct tb_budget bud;
    const char *why = "";
    bs_mode = MODE_ENV;
    if (tb_env_parse(m, r, b, &bud, &why) != TB_OK) {
        th_log("bad TESSERA_MEMORY_LIMIT/TESSERA_CORE_RATE/TESSERA_CORE_BURST (%s): "
               "refusing device memory", why);
        deny_all();
    } else {
        apply_budget(&bud);
        ever_valid = 1;
    }
    __atomic_store_n(&bs_gen, 0, __ATOMIC_RELEASE);
}

void budget_start(void)
{
    int fd = open(TB_BUDGET_PATH, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT && th_managed()) {
        /* tessera set this container up: it never runs unbudgeted */
        bs_mode = MODE_FILE;
        deny_all();
        th_log("budget file %s missing in a container set up by tessera: refusing GPU memory",
               TB_BUDGET_PATH);
        return;
    }
    if (fd < 0 && errno == ENOENT) {
        budget_from_env();
        return;
    }
    bs_mode = MODE_FILE;
    deny_all();
    const char *why = "unreadable";
    if (fd < 0 || !budget_file_ok(fd, &why)) {
        th_log("budget file %s %s: refusing device memory", TB_BUDGET_PATH, why);
        if (fd >= 0)
            close(fd);
        return;
    }
    blen = TB_FILE_SIZE;
    void *m = mmap(NULL, blen, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        th_log("cannot map budget file %s: refusing device memory", TB_BUDGET_PATH);
        return;
    }
    bs_map = m;
    budget_first_read();
}

/* Slow path: the generation moved.  Returns with the budget updated (or unchanged on
 * failure). */
void budget_reload(void)
{
    const volatile unsigned char *map = bs_map;
    pthread_mutex_lock(&reload_mu);
    for (int tries = 0; tries < 10000; tries++) {
        struct tb_budget b;
        const char *why = "";
        uint64_t g = __atomic_load_n((const volatile uint64_t *)(map + 8), __ATOMIC_ACQUIRE);
        if (g == __atomic_load_n(&bs_gen, __ATOMIC_ACQUIRE))
            break;
        int r = tb_parse(map, blen, &b, &why);
        if (r == TB_TORN) {
            if (tries > 100)
                sched_yield();
            continue;
        }
        if (r == TB_BAD) {
            static uint64_t bad_gen = UINT64_MAX;
            if (bad_gen != g)
                th_log("budget file %s malformed (%s): keeping the %s", TB_BUDGET_PATH, why,
                       ever_valid ? "last valid budget" : "safe default (no device memory)");
            bad_gen = g;
        } else {
            if (b.state & TB_REFUSED) {
                static uint64_t refused_gen = UINT64_MAX;
                if (refused_gen != g)
                    th_log("budget refused by the node daemon: %s: refusing GPU memory",
                           b.reason[0] ? b.reason : "no reason given");
                refused_gen = g;
            }
            /* the launch fast path reads entry 0 alone while bs_one_map is set: cleared
             * before the values change, set again once the generation is published */
            __atomic_store_n(&bs_one_map, NULL, __ATOMIC_RELEASE);
            if (b.state & (TB_PENDING | TB_REFUSED))
                deny_all();
            else
                apply_budget(&b);
            cur_wait_ms = b.wait_ms;
            ledger_dev = b.ledger_dev;
            ledger_ino = b.ledger_ino;
            __atomic_store_n(&cur_state, b.state, __ATOMIC_RELAXED);
            ever_valid = 1;
        }
        __atomic_store_n(&bs_gen, g, __ATOMIC_RELEASE);
        if (bs_ndev == 1)
            __atomic_store_n(&bs_one_map, map, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&reload_mu);
}

void budget_ledger(uint64_t *dev, uint64_t *ino)
{
    *dev = ledger_dev;
    *ino = ledger_ino;
}

void budget_reset_child(void)
{
    pthread_mutex_init(&reload_mu, NULL);
}
