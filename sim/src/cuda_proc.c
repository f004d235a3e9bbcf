/* Fake libcuda.so.1: cuGetProcAddress (version-aware, from cuda_procs.h) and the simulator's
 * fault control.  The runtime's export tables are in cuda_export.c. */
#include "cuda_core.h"

#include <string.h>

/* Simulator control, for tests: make the next `count` calls of `fn` (in every process of
 * the node) fail with `code` after `delay_us`.  count -1: every call; code 0: delay only. */
EXPORT int tesseraSimSetFault(const char *fn, int count, int code, unsigned delay_us)
{
    if (sim_attach() != 0)
        return -1;
    return sim_fault_set(fn, count, code, delay_us);
}

#include "cuda_procs.h"

static CUresult proc_lookup(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    if (!sym || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int best = -1, seen = 0;
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        if (strcmp(procs[i].name, sym) != 0)
            continue;
        seen = 1;
        if (procs[i].version <= ver && (best < 0 || procs[i].version > procs[best].version))
            best = (int)i;
    }
    if (best < 0) {
        if (st)
            *st = seen ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = procs[best].fn;
    if (st)
        *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    int code = sim_fault(__func__);
    if (code)
        return (CUresult)code;
    return proc_lookup(sym, pfn, ver, flags, st);
}

EXPORT CUresult sim_cuGetProcAddress_v1(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
    return proc_lookup(sym, pfn, ver, flags, NULL);
}
