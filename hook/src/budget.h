/* Budget parsing: pure functions over bytes and strings (fuzzed in hook/fuzz). */
#ifndef TESSERA_BUDGET_H
#define TESSERA_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "formats.h"

struct tb_dev {
    uint8_t uuid[16];
    uint32_t index;
    uint32_t flags;
    uint64_t mem_limit;
    uint32_t core_target;
    uint64_t rate_milli;
    uint64_t burst_milli;
    uint64_t context_bytes;
};

struct tb_budget {
    uint64_t generation;
    uint32_t state;                  /* header flags: TB_PENDING, TB_REFUSED or 0 (ready) */
    uint32_t wait_ms;                /* PENDING: capped at TB_WAIT_MAX_MS */
    char reason[TB_REASON_LEN];      /* REFUSED: why (NUL-terminated; may be empty) */
    uint64_t ledger_dev, ledger_ino; /* the ledger the daemon created (0: none named) */
    uint32_t ndev;
    struct tb_dev dev[TB_MAX_DEV];
};

enum { TB_OK = 0, TB_TORN = -1, TB_BAD = -2 };

/* Copy a consistent snapshot out of a (possibly concurrently written) budget file mapping of
 * len bytes.  TB_TORN: a write is in progress, retry.  TB_BAD: malformed, *why says how. */
int tb_parse(const volatile void *map, size_t len, struct tb_budget *out, const char **why);

/* Environment fallback (no budget file mounted).  Any argument may be NULL.
 *   mem:   "<size>" for every device, or "<idx>:<size>[,<idx>:<size>...]"; size = integer
 *          bytes with optional suffix k/K/Ki, m/M/Mi, g/G/Gi, t/T/Ti (binary multiples).
 *   rate:  launches per second (decimal, up to 3 fraction digits), same list syntax.
 *   burst: bucket depth in launches (same syntax as rate, one value for all devices).
 * TB_OK, or TB_BAD with *why. */
int tb_env_parse(const char *mem, const char *rate, const char *burst, struct tb_budget *out,
                 const char **why);

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" / "MIG-..." -> 16 bytes. 0 ok, -1 bad. */
int tb_uuid_parse(const char *s, uint8_t out[16]);

#endif
