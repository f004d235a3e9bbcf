/* libtessera: the memory views.  cuMemGetInfo_v2, cuDeviceTotalMem_v2 and NVML's memory
 * info report the budget as the device's total and the container's bytes as used. */
#include "budget_state.h"
#include "ledger_attach.h"
#include "ordinal.h"
#include "pools.h"
#include "startup.h"

#include <string.h>

/* ---- views: the budget is the device's total, the container's use is what is used ---- */
static int view(int e, uint64_t phys_total, uint64_t *total, uint64_t *used)
{
    if (e < 0)
        return 0;
    pools_settle_all(); /* what a synchronisation trimmed is no longer held */
    budget_check();
    uint32_t f = budget_flags(e);
    uint64_t lim = (f & TB_DEV_MEM_LIMIT) ? budget_limit(e) : phys_total;
    *total = lim < phys_total ? lim : phys_total;
    struct tl *l = ledger_or_lost();
    uint64_t u = l ? __atomic_load_n(&l->h->dev[e].used, __ATOMIC_RELAXED) : 0;
    uint64_t own = l ? __atomic_load_n(&l->own[e], __ATOMIC_RELAXED) : 0;
    if (u < own)
        u = own; /* what this process holds is used, whatever the shared count says */
    *used = u < *total ? u : *total;
    return 1;
}

EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    CU_READY();
    REAL_OR_FAIL(cuMemGetInfo_v2);
    size_t f = 0, t = 0;
    CUresult r = REAL(cuMemGetInfo_v2)(&f, &t);
    if (r != CUDA_SUCCESS || budget_mode() == MODE_OFF) {
        if (r == CUDA_SUCCESS) {
            if (free_) *free_ = f;
            if (total) *total = t;
        }
        return r;
    }
    CUdevice d;
    uint64_t vt, vu;
    if (drv.cuCtxGetDevice && drv.cuCtxGetDevice(&d) == CUDA_SUCCESS) {
        budget_check();
        if (view(entry_of_ordinal(d), t, &vt, &vu)) {
            uint64_t vf = vt - vu;
            t = (size_t)vt;
            f = vf < f ? (size_t)vf : f;
        } else {
            t = 0;
            f = 0;
        }
    }
    if (free_) *free_ = f;
    if (total) *total = t;
    return r;
}

EXPORT CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CU_READY();
    REAL_OR_FAIL(cuDeviceTotalMem_v2);
    size_t t = 0;
    CUresult r = REAL(cuDeviceTotalMem_v2)(&t, dev);
    if (r == CUDA_SUCCESS && budget_mode() != MODE_OFF) {
        uint64_t vt, vu;
        budget_check();
        t = view(entry_of_ordinal(dev), t, &vt, &vu) ? (size_t)vt : 0;
    }
    if (r == CUDA_SUCCESS && bytes)
        *bytes = t;
    return r;
}

/* ====================================================================================
 * NVML
 * ==================================================================================== */
static int nvml_entry(nvmlDevice_t dev)
{
    budget_check();
    char buf[96];
    uint8_t u[16];
    int have = drv.nvmlDeviceGetUUID && drv.nvmlDeviceGetUUID(dev, buf, sizeof buf) == NVML_SUCCESS &&
               tb_uuid_parse(buf, u) == 0;
    unsigned idx = 0;
    int have_idx = drv.nvmlDeviceGetIndex && drv.nvmlDeviceGetIndex(dev, &idx) == NVML_SUCCESS;
    for (uint32_t i = 0; i < budget_ndev() && i < TB_MAX_DEV; i++) {
        uint32_t f = budget_flags((int)i);
        if ((f & TB_DEV_UUID) ? (have && !memcmp(u, budget_uuid((int)i), 16))
                              : (have_idx && budget_index((int)i) == idx))
            return (int)i;
    }
    return -1;
}

/* NVML's memory view, v1 and v2 alike: the budget is the total, the container's use is used;
 * a device outside the budget shows nothing. */
static void nvml_view(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_)
{
    uint64_t t, u;
    if (view(nvml_entry(dev), *total, &t, &u)) {
        *total = t;
        *used = u;
        *free_ = t - u;
    } else {
        *total = *used = *free_ = 0;
    }
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
    NVML_READY();
    if (!REAL(nvmlDeviceGetMemoryInfo))
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo)(dev, m);
    if (r == NVML_SUCCESS && m && budget_mode() != MODE_OFF)
        nvml_view(dev, &m->total, &m->used, &m->free);
    return r;
}

EXPORT nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
    NVML_READY();
    if (!REAL(nvmlDeviceGetMemoryInfo_v2))
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t r = REAL(nvmlDeviceGetMemoryInfo_v2)(dev, m);
    if (r == NVML_SUCCESS && m && budget_mode() != MODE_OFF) {
        nvml_view(dev, &m->total, &m->used, &m->free);
        m->reserved = 0;
    }
    return r;
}

