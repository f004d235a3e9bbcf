/* libFuzzer target: the budget file parser on arbitrary bytes (as mapped from disk). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "budget.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tb_budget b;
    const char *why = "";
    int r = tb_parse(data, size, &b, &why);
    if (r == TB_OK) {
        if (b.ndev > TB_MAX_DEV)
            __builtin_trap();
        for (uint32_t i = 0; i < b.ndev; i++)
            if (b.dev[i].flags & ~TB_DEV_FLAGS)
                __builtin_trap();
    } else if (r == TB_BAD && (!why || !*why)) {
        __builtin_trap();
    }
    return 0;
}
