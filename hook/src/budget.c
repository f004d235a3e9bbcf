/* Budget file and environment fallback parsers.  No allocation, no global state. */
#include "budget.h"

#include <string.h>

int tb_parse(const volatile void *map, size_t len, struct tb_budget *out, const char **why)
{
    const volatile unsigned char *p = map;
    struct tb_file_header h;
    struct tb_file_dev d[TB_MAX_DEV];
    char reason[TB_REASON_LEN];

    if (map == NULL || len < sizeof h) {
        *why = "file shorter than its header";
        return TB_BAD;
    }
    const volatile uint64_t *genp = (const volatile uint64_t *)(p + 8);
    uint64_t g1 = __atomic_load_n(genp, __ATOMIC_ACQUIRE);
    if (g1 & 1)
        return TB_TORN;
    for (size_t i = 0; i < sizeof h; i++)
        ((unsigned char *)&h)[i] = p[i];
    size_t n = h.ndev <= TB_MAX_DEV ? h.ndev : 0;
    size_t need = sizeof h + n * sizeof d[0];
    if (need <= len && h.header_size == sizeof h && h.entry_size == sizeof d[0]) {
        for (size_t i = 0; i < n * sizeof d[0]; i++)
            ((unsigned char *)d)[i] = p[sizeof h + i];
    }
    reason[0] = 0;
    if ((h.flags & TB_REFUSED) && len >= TB_REASON_OFF + TB_REASON_LEN)
        for (size_t i = 0; i < TB_REASON_LEN; i++)
            reason[i] = (char)p[TB_REASON_OFF + i];
    reason[TB_REASON_LEN - 1] = 0;
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(genp, __ATOMIC_RELAXED) != g1)
        return TB_TORN;

    if (h.magic != TB_MAGIC) {
        *why = "bad magic";
        return TB_BAD;
    }
    if (h.version != TB_VERSION) {
        *why = "unsupported version";
        return TB_BAD;
    }
    if (h.header_size != sizeof h || h.entry_size != sizeof d[0]) {
        *why = "bad header or entry size";
        return TB_BAD;
    }
    if (h.ndev > TB_MAX_DEV) {
        *why = "too many devices";
        return TB_BAD;
    }
    if (need > len) {
        *why = "file shorter than its entries";
        return TB_BAD;
    }
    if (h.flags & ~(uint32_t)TB_HDR_FLAGS) {
        *why = "unknown header flags";
        return TB_BAD;
    }
    if ((h.flags & TB_HDR_FLAGS) == TB_HDR_FLAGS) {
        *why = "both pending and refused";
        return TB_BAD;
    }
    if ((h.flags & TB_HDR_FLAGS) && h.ndev) {
        *why = "a pending or refused budget names devices";
        return TB_BAD;
    }
    memset(out, 0, sizeof *out);
    out->generation = g1;
    out->state = h.flags;
    out->wait_ms = h.wait_ms < TB_WAIT_MAX_MS ? h.wait_ms : TB_WAIT_MAX_MS;
    out->ledger_dev = h.ledger_dev;
    out->ledger_ino = h.ledger_ino;
    memcpy(out->reason, reason, sizeof reason);
    out->ndev = h.ndev;
    for (size_t i = 0; i < n; i++) {
        if (d[i].flags & ~(uint32_t)TB_DEV_FLAGS) {
            *why = "unknown device flags";
            return TB_BAD;
        }
        if ((d[i].flags & TB_DEV_MIG) && !(d[i].flags & TB_DEV_UUID)) {
            *why = "MIG flag without a UUID";
            return TB_BAD;
        }
        if ((d[i].flags & TB_DEV_CORE_LIMIT) && d[i].rate_milli > 0 && d[i].burst_milli == 0) {
            *why = "core limit without a bucket depth";
            return TB_BAD;
        }
        if (!(d[i].flags & TB_DEV_UUID) && d[i].index >= 64) {
            *why = "device index out of range";
            return TB_BAD;
        }
        memcpy(out->dev[i].uuid, d[i].uuid, 16);
        out->dev[i].index = d[i].index;
        out->dev[i].flags = d[i].flags;
        out->dev[i].mem_limit = d[i].mem_limit;
        out->dev[i].core_target = d[i].core_target;
        out->dev[i].rate_milli = d[i].rate_milli;
        out->dev[i].burst_milli = d[i].burst_milli;
        out->dev[i].context_bytes = d[i].context_bytes;
    }
    return TB_OK;
}

/* Parse an unsigned decimal with optional fraction (scale: 1 = integer, 1000 = milli) and,
 * when suffixes != 0, a binary size suffix.  Returns pointer past the number or NULL. */
static const char *parse_num(const char *s, uint64_t scale, int suffixes, uint64_t *out)
{
    uint64_t v = 0;
    int digits = 0;
    while (*s >= '0' && *s <= '9') {
        uint64_t dgt = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - dgt) / 10)
            return NULL;
        v = v * 10 + dgt;
        s++;
        digits++;
    }
    if (!digits)
        return NULL;
    uint64_t frac = 0, fscale = 1;
    if (scale > 1 && *s == '.') {
        s++;
        int fd = 0;
        while (*s >= '0' && *s <= '9') {
            if (fscale < scale) {
                frac = frac * 10 + (uint64_t)(*s - '0');
                fscale *= 10;
            }
            s++;
            fd++;
        }
        if (!fd)
            return NULL;
    }
    if (v > UINT64_MAX / scale)
        return NULL;
    v = v * scale + frac * (scale / fscale);
    if (suffixes) {
        unsigned shift = 0;
        switch (*s) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        case 't': case 'T': shift = 40; break;
        default: break;
        }
        if (shift) {
            s++;
            if (*s == 'i')
                s++;
            if (*s == 'B' || *s == 'b')
                s++;
            if (v > (UINT64_MAX >> shift))
                return NULL;
            v <<= shift;
        }
    }
    *out = v;
    return s;
}

/* Apply a list spec to every device: set(dev, value).  Returns TB_OK or TB_BAD. */
static int parse_list(const char *spec, uint64_t scale, int suffixes, uint64_t vals[TB_MAX_DEV],
                      int set[TB_MAX_DEV], const char **why)
{
    const char *s = spec;
    uint64_t v;
    const char *colon = strchr(spec, ':');
    if (!colon) {
        const char *e = parse_num(s, scale, suffixes, &v);
        if (!e || *e) {
            *why = "not a number";
            return TB_BAD;
        }
        for (int i = 0; i < TB_MAX_DEV; i++) {
            vals[i] = v;
            set[i] = 1;
        }
        return TB_OK;
    }
    for (;;) {
        uint64_t idx;
        const char *e = parse_num(s, 1, 0, &idx);
        if (!e || *e != ':' || idx >= TB_MAX_DEV) {
            *why = "bad device index";
            return TB_BAD;
        }
        e = parse_num(e + 1, scale, suffixes, &v);
        if (!e || (*e && *e != ',')) {
            *why = "not a number";
            return TB_BAD;
        }
        if (set[idx]) {
            *why = "device listed twice";
            return TB_BAD;
        }
        vals[idx] = v;
        set[idx] = 1;
        if (!*e)
            return TB_OK;
        s = e + 1;
    }
}

int tb_env_parse(const char *mem, const char *rate, const char *burst, struct tb_budget *out,
                 const char **why)
{
    uint64_t mv[TB_MAX_DEV] = {0}, rv[TB_MAX_DEV] = {0}, bv[TB_MAX_DEV] = {0};
    int ms[TB_MAX_DEV] = {0}, rs[TB_MAX_DEV] = {0}, bs[TB_MAX_DEV] = {0};
    memset(out, 0, sizeof *out);
    if (mem && *mem && parse_list(mem, 1, 1, mv, ms, why) != TB_OK)
        return TB_BAD;
    if (rate && *rate && parse_list(rate, 1000, 0, rv, rs, why) != TB_OK)
        return TB_BAD;
    if (burst && *burst) {
        if (strchr(burst, ':') || parse_list(burst, 1000, 0, bv, bs, why) != TB_OK) {
            *why = "bad burst";
            return TB_BAD;
        }
    }
    out->ndev = TB_MAX_DEV;
    for (uint32_t i = 0; i < TB_MAX_DEV; i++) {
        struct tb_dev *d = &out->dev[i];
        d->index = i;
        if (ms[i]) {
            d->flags |= TB_DEV_MEM_LIMIT;
            d->mem_limit = mv[i];
        }
        if (rs[i]) {
            d->flags |= TB_DEV_CORE_LIMIT;
            d->rate_milli = rv[i];
            /* default depth: 50 ms of launches, at least one */
            uint64_t b = bs[i] ? bv[i] : rv[i] / 20;
            d->burst_milli = b < 1000 ? 1000 : b;
        }
    }
    return TB_OK;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int tb_uuid_parse(const char *s, uint8_t out[16])
{
    if (!s)
        return -1;
    if (!strncmp(s, "GPU-", 4) || !strncmp(s, "MIG-", 4))
        s += 4;
    int n = 0;
    while (*s && n < 32) {
        if (*s == '-') {
            s++;
            continue;
        }
        int v = hexval(*s++);
        if (v < 0)
            return -1;
        if (n & 1)
            out[n / 2] = (uint8_t)(out[n / 2] | v);
        else
            out[n / 2] = (uint8_t)(v << 4);
        n++;
    }
    return (n == 32 && *s == 0) ? 0 : -1;
}
