/* Fake libnvidia-ml.so.1: MIG devices -- the handles of a MIG-enabled GPU's compute
 * instances (those this process sees, simdev.c), their parent, their GPU and compute
 * instance IDs, and the device attributes. */
#include "nvml_core.h"

#include <string.h>

DEVICE_QUERY(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t d, unsigned int *count), !count, 0,
             *count = is_mig_handle(d) || !table_of(d->gpu) ? 0 : table_of(d->gpu)->compute_slices)

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    ENTER();
    CHECK_DEV(d);
    if (!out || is_mig_handle(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!S()->gpu[d->gpu].mig_current)
        return NVML_ERROR_NOT_FOUND;
    LOCK();
    int slots[SIM_MAX_GIS * SIM_MAX_CIS], cis[SIM_MAX_GIS * SIM_MAX_CIS];
    int n = sim_mig_devices(d->gpu, slots, cis, SIM_MAX_GIS * SIM_MAX_CIS);
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    if (index < (unsigned)n) {
        *out = &g_mig[d->gpu][slots[index] - 1][cis[index]];
        rc = NVML_SUCCESS;
    }
    sim_unlock();
    return rc;
}

DEVICE_QUERY(nvmlDeviceGetDeviceHandleFromMigDeviceHandle, (nvmlDevice_t d, nvmlDevice_t *out),
             !out || !is_mig_handle(d), 0, *out = &g_phys[d->gpu])
DEVICE_QUERY(nvmlDeviceIsMigDeviceHandle, (nvmlDevice_t d, unsigned int *is_mig), !is_mig, 0,
             *is_mig = (unsigned)is_mig_handle(d))
DEVICE_QUERY(nvmlDeviceGetGpuInstanceId, (nvmlDevice_t d, unsigned int *id), !id, !is_mig_handle(d),
             *id = S()->gpu[d->gpu].gi[d->gi].id)
DEVICE_QUERY(nvmlDeviceGetComputeInstanceId, (nvmlDevice_t d, unsigned int *id), !id, !is_mig_handle(d),
             *id = S()->gpu[d->gpu].gi[d->gi].ci[d->ci].id)

EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a)
{
    ENTER();
    CHECK_DEV(d);
    if (!a)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(a, 0, sizeof *a);
    const struct sim_gpu *g = &S()->gpu[d->gpu];
    if (!is_mig_handle(d)) {
        a->multiprocessorCount = g->sm_count;
        a->memorySizeMB = g->memory_mib;
        a->gpuInstanceSliceCount = a->computeInstanceSliceCount = table_of(d->gpu) ? table_of(d->gpu)->compute_slices : 0;
        return NVML_SUCCESS;
    }
    const struct sim_mig_profile *p = gi_profile(d->gpu, d->gi);
    const struct sim_ci *ci = &g->gi[d->gi].ci[d->ci];
    a->multiprocessorCount = ci->size == p->compute_slices ? p->sm : p->sm * ci->size / p->compute_slices;
    a->sharedCopyEngineCount = p->ce;
    a->sharedDecoderCount = p->dec;
    a->sharedJpegCount = p->jpeg;
    a->sharedOfaCount = p->ofa;
    a->gpuInstanceSliceCount = p->compute_slices;
    a->computeInstanceSliceCount = ci->size;
    a->memorySizeMB = p->memory_mib;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *a) { return nvmlDeviceGetAttributes_v2(d, a); }
