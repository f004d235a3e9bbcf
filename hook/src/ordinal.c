/* libtessera: which budget entry a CUDA ordinal is.  An entry names its device by UUID (the
 * driver's cuDeviceGetUuid of the ordinal) or by ordinal; the answer is kept per ordinal until
 * the budget's generation moves. */
#include "ordinal.h"

#include <string.h>

struct ordinal_map ordinal_map = {.gen = UINT64_MAX, .ndevices = -1};

void ordinal_start(void)
{
    for (int i = 0; i < MAX_ORD; i++)
        ordinal_map.entry[i] = -2;
}

int entry_of_ordinal_slow(int ord, uint64_t g)
{
    struct ordinal_map *m = &ordinal_map;
    if (g != m->gen) {
        for (int i = 0; i < MAX_ORD; i++)
            __atomic_store_n(&m->entry[i], -2, __ATOMIC_RELAXED);
        __atomic_store_n(&m->gen, g, __ATOMIC_RELEASE);
    }
    int e = -1;
    CUuuid u;
    int have_uuid = -1;
    for (uint32_t i = 0; i < budget_ndev() && i < TB_MAX_DEV; i++) {
        uint32_t f = budget_flags((int)i);
        if (f & TB_DEV_UUID) {
            if (have_uuid < 0)
                have_uuid = drv.cuDeviceGetUuid && drv.cuDeviceGetUuid(&u, ord) == CUDA_SUCCESS;
            if (have_uuid && !memcmp(u.bytes, budget_uuid((int)i), 16)) {
                e = (int)i;
                break;
            }
        } else if (budget_index((int)i) == (uint32_t)ord) {
            e = (int)i;
            break;
        }
    }
    __atomic_store_n(&m->entry[ord], e, __ATOMIC_RELAXED);
    return e;
}
