/* Fake libnvidia-ml.so.1: MIG mode.  Hopper and later switch an idle GPU at once; Ampere
 * (and a busy GPU) keep the new mode pending until a GPU reset, which MIG instances do not
 * survive. */
#include "nvml_core.h"

#include <string.h>

static int gpu_has_processes(int gpu)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc *p = &S()->proc[i];
        if (!p->pid)
            continue;
        for (int t = 0; t < SIM_TARGETS; t++)
            if (p->ctx[gpu][t] || p->mem[gpu][t])
                return 1;
    }
    return 0;
}

static int gpu_has_gis(int gpu)
{
    for (int i = 0; i < SIM_MAX_GIS; i++)
        if (S()->gpu[gpu].gi[i].used)
            return 1;
    return 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    ENTER();
    CHECK_DEV(d);
    if (!cur || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_table < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    LOCK();
    *cur = (unsigned)S()->gpu[d->gpu].mig_current;
    *pending = (unsigned)S()->gpu[d->gpu].mig_pending;
    sim_unlock();
    return NVML_SUCCESS;
}

/* Hopper and later switch at once when idle; Ampere (mig_mode_change=reset) and busy GPUs
 * keep the new mode pending until a GPU reset (tesseraSimResetGpu, nvidia-smi -r). */
EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation)
{
    ENTER();
    CHECK_DEV(d);
    if (!activation || mode > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_table < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    LOCK();
    struct sim_gpu *g = &S()->gpu[d->gpu];
    nvmlReturn_t rc = NVML_SUCCESS;
    *activation = NVML_SUCCESS;
    if (mode == 0 && gpu_has_gis(d->gpu)) {
        rc = NVML_ERROR_IN_USE;
    } else if ((int)mode == g->mig_current) {
        g->mig_pending = (int)mode;
    } else {
        g->mig_pending = (int)mode;
        if (gpu_has_processes(d->gpu))
            *activation = NVML_ERROR_IN_USE;
        else if (g->mig_needs_reset)
            *activation = NVML_ERROR_NOT_SUPPORTED;
        else
            g->mig_current = (int)mode;
    }
    sim_unlock();
    return rc;
}

/* GPU reset (nvidia-smi -r): refuses while processes use the GPU; applies a pending MIG
 * mode; MIG instances do not survive it. */
EXPORT int tesseraSimResetGpu(unsigned int index)
{
    if (sim_attach() != 0 || sim_lock(1) != 0)
        return NVML_ERROR_UNINITIALIZED;
    int rc = NVML_SUCCESS;
    if (index >= S()->ngpus) {
        rc = NVML_ERROR_INVALID_ARGUMENT;
    } else if (gpu_has_processes((int)index)) {
        rc = NVML_ERROR_IN_USE;
    } else {
        struct sim_gpu *g = &S()->gpu[index];
        g->mig_current = g->mig_pending;
        memset(g->gi, 0, sizeof g->gi);
    }
    sim_unlock();
    return rc;
}
