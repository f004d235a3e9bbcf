/* libFuzzer target: ledger header validation on arbitrary bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ledger.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a full-size ledger image whose header is the input */
    static unsigned char *img;
    if (!img && !(img = malloc(TL_FILE_SIZE)))
        return 0;
    memset(img, 0, TL_HEADER_SIZE);
    memcpy(img, data, size < TL_HEADER_SIZE ? size : TL_HEADER_SIZE);
    const char *why = "";
    if (tl_validate(img, TL_FILE_SIZE, &why) != 0 && (!why || !*why))
        __builtin_trap();
    tl_validate(img, size, &why);
    return 0;
}
