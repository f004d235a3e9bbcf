/* libFuzzer target: the environment fallback (three NUL-separated variables) and UUIDs. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 3);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = buf[size + 2] = 0;
    const char *mem = buf;
    const char *rate = mem + strlen(mem) + 1;
    const char *burst = rate <= buf + size ? rate + strlen(rate) + 1 : buf + size + 2;
    if (burst > buf + size + 2)
        burst = buf + size + 2;
    struct tb_budget b;
    const char *why = "";
    if (tb_env_parse(mem, rate, burst, &b, &why) == TB_OK) {
        for (int i = 0; i < TB_MAX_DEV; i++)
            if ((b.dev[i].flags & TB_DEV_CORE_LIMIT) && b.dev[i].burst_milli < 1000)
                __builtin_trap();
    }
    uint8_t u[16];
    tb_uuid_parse(mem, u);
    free(buf);
    return 0;
}
