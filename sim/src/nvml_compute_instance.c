/* Fake libnvidia-ml.so.1: compute instances of a GPU instance.  Profiles, placements (from
 * the bottom of the GPU instance), remaining capacity, create, list, look up and destroy;
 * IDs are the lowest free. */
#include "nvml_core.h"

#include <stdio.h>
#include <string.h>

/* GPU instance h (checked) and the shape of compute instance profile `profile` in it: *c
 * compute slices, at one of the nstarts starts.  Caller holds the lock. */
static nvmlReturn_t ci_shape(nvmlGpuInstance_t h, unsigned profile, uint32_t *c, uint32_t *starts, uint32_t *nstarts)
{
    if (!gi_ok(h))
        return NVML_ERROR_INVALID_ARGUMENT;
    int slices = sim_ci_slices_for_nvml_id(profile);
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = gi_profile(h->gpu, h->gi);
    if (slices < 0 || !p || !sim_ci_shape(table_of(h->gpu)->compute_slices, p->compute_slices, (uint32_t)slices, starts, nstarts))
        return NVML_ERROR_NOT_SUPPORTED;
    *c = (uint32_t)slices;
    return NVML_SUCCESS;
}

static void ci_name(int gpu, int gi, uint32_t c, char *buf, size_t cap)
{
    const struct sim_mig_profile *p = gi_profile(gpu, gi);
    if (c == p->compute_slices)
        snprintf(buf, cap, "MIG %s", p->name);
    else
        snprintf(buf, cap, "MIG %uc.%s", c, p->name);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(nvmlGpuInstance_t h, unsigned int profile, unsigned int eng,
                                                                   nvmlComputeInstanceProfileInfo_v2_t *info)
{
    ENTER();
    if (!info || eng != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlComputeInstanceProfileInfo_v2 && info->version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    LOCK();
    uint32_t c = 0, starts[8], ns = 0;
    nvmlReturn_t rc = ci_shape(h, profile, &c, starts, &ns);
    if (rc == NVML_SUCCESS) {
        const struct sim_mig_profile *p = gi_profile(h->gpu, h->gi);
        nvmlComputeInstanceProfileInfo_v3_t v3 = {.version = info->version};
        v3.id = profile;
        v3.sliceCount = c;
        v3.instanceCount = ns;
        v3.multiprocessorCount = c == p->compute_slices ? p->sm : p->sm * c / p->compute_slices;
        v3.sharedCopyEngineCount = p->ce;
        v3.sharedDecoderCount = p->dec;
        v3.sharedEncoderCount = p->enc;
        v3.sharedJpegCount = p->jpeg;
        v3.sharedOfaCount = p->ofa;
        ci_name(h->gpu, h->gi, c, v3.name, sizeof v3.name);
        if (info->version == nvmlComputeInstanceProfileInfo_v3)
            memcpy(info, &v3, sizeof v3);
        else
            memcpy(info, &v3, sizeof *info);
    }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(nvmlGpuInstance_t h, unsigned int profile, unsigned int eng,
                                                                  nvmlComputeInstanceProfileInfo_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlComputeInstanceProfileInfo_v2_t v2 = {.version = nvmlComputeInstanceProfileInfo_v2};
    nvmlReturn_t rc = nvmlGpuInstanceGetComputeInstanceProfileInfoV(h, profile, eng, &v2);
    if (rc == NVML_SUCCESS) {
        info->id = v2.id;
        info->sliceCount = v2.sliceCount;
        info->instanceCount = v2.instanceCount;
        info->multiprocessorCount = v2.multiprocessorCount;
        info->sharedCopyEngineCount = v2.sharedCopyEngineCount;
        info->sharedDecoderCount = v2.sharedDecoderCount;
        info->sharedEncoderCount = v2.sharedEncoderCount;
        info->sharedJpegCount = v2.sharedJpegCount;
        info->sharedOfaCount = v2.sharedOfaCount;
    }
    return rc;
}

static uint32_t ci_mask(const struct sim_gi *gi)
{
    uint32_t m = 0;
    for (int c = 0; c < SIM_MAX_CIS; c++)
        if (gi->ci[c].used)
            m |= ((1u << gi->ci[c].size) - 1) << gi->ci[c].start;
    return m;
}

/* Lowest free start (CIs are placed from the bottom of their GI). */
static nvmlReturn_t place_ci(const struct sim_gi *gi, uint32_t c, const uint32_t *starts, uint32_t ns, int want, uint32_t *start)
{
    uint32_t mask = ci_mask(gi);
    for (uint32_t k = 0; k < ns; k++) {
        if (want >= 0 && starts[k] != (uint32_t)want)
            continue;
        if (!(mask & (((1u << c) - 1) << starts[k]))) {
            *start = starts[k];
            return NVML_SUCCESS;
        }
        if (want >= 0)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    return want >= 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_INSUFFICIENT_RESOURCES;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(nvmlGpuInstance_t h, unsigned int profile, unsigned int *count)
{
    ENTER();
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    uint32_t c = 0, starts[8], ns = 0, n = 0;
    nvmlReturn_t rc = ci_shape(h, profile, &c, starts, &ns);
    if (rc == NVML_SUCCESS) {
        struct sim_gi copy = S()->gpu[h->gpu].gi[h->gi];
        uint32_t start;
        for (int slot = 0; slot < SIM_MAX_CIS; slot++) {
            if (copy.ci[slot].used)
                continue;
            if (place_ci(&copy, c, starts, ns, -1, &start) != NVML_SUCCESS)
                break;
            copy.ci[slot].used = 1;
            copy.ci[slot].start = start;
            copy.ci[slot].size = c;
            n++;
        }
        *count = n;
    }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(nvmlGpuInstance_t h, unsigned int profile,
                                                                        nvmlComputeInstancePlacement_t *pl, unsigned int *count)
{
    ENTER();
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    uint32_t c = 0, starts[8], ns = 0;
    nvmlReturn_t rc = ci_shape(h, profile, &c, starts, &ns);
    if (rc == NVML_SUCCESS && pl && *count < ns)
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    if (rc == NVML_SUCCESS && pl)
        for (uint32_t i = 0; i < ns; i++) {
            pl[i].start = starts[i];
            pl[i].size = c;
        }
    if (rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_SIZE)
        *count = ns;
    sim_unlock();
    return rc;
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t h, unsigned profile, int want, unsigned want_size, nvmlComputeInstance_t *out)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    uint32_t c = 0, starts[8], ns = 0, start = 0;
    int ci_id = -1;
    uint32_t gi_id = 0;
    nvmlReturn_t rc = ci_shape(h, profile, &c, starts, &ns);
    if (rc == NVML_SUCCESS && want >= 0 && want_size != c)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gi *gi = rc == NVML_SUCCESS ? &S()->gpu[h->gpu].gi[h->gi] : NULL;
    if (rc == NVML_SUCCESS)
        rc = place_ci(gi, c, starts, ns, want, &start);
    if (rc == NVML_SUCCESS) {
        int slot = -1;
        uint32_t used_ids = 0;
        for (int k = 0; k < SIM_MAX_CIS; k++) {
            if (gi->ci[k].used)
                used_ids |= 1u << gi->ci[k].id;
            else if (slot < 0)
                slot = k;
        }
        if (slot < 0) {
            rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
        } else {
            uint32_t id = 0;
            while (used_ids & (1u << id))
                id++;
            struct sim_ci *ci = &gi->ci[slot];
            ci->id = id;
            ci->profile_id = profile;
            ci->start = start;
            ci->size = c;
            ci->serial = ++S()->serial;
            ci->used = 1;
            *out = &g_cih[h->gpu][h->gi][slot];
            ci_id = (int)id;
            gi_id = gi->id;
        }
    }
    sim_unlock();
    if (rc == NVML_SUCCESS)
        sim_dev_publish_cap(h->gpu, gi_id, ci_id); /* its access capability's device file */
    return rc;
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t h, unsigned int profile, nvmlComputeInstance_t *ci)
{
    ENTER();
    return create_ci(h, profile, -1, 0, ci);
}

EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(nvmlGpuInstance_t h, unsigned int profile,
                                                                      const nvmlComputeInstancePlacement_t *pl,
                                                                      nvmlComputeInstance_t *ci)
{
    ENTER();
    if (!pl)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_ci(h, profile, (int)pl->start, pl->size, ci);
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t h, unsigned int profile, nvmlComputeInstance_t *cis,
                                                       unsigned int *count)
{
    ENTER();
    if (!count || !cis)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    uint32_t c = 0, starts[8], ns = 0;
    nvmlReturn_t rc = ci_shape(h, profile, &c, starts, &ns);
    unsigned n = 0;
    if (rc == NVML_SUCCESS) {
        const struct sim_gi *gi = &S()->gpu[h->gpu].gi[h->gi];
        for (uint32_t id = 0; id < SIM_MAX_CIS; id++)
            for (int k = 0; k < SIM_MAX_CIS; k++)
                if (gi->ci[k].used && gi->ci[k].id == id && gi->ci[k].profile_id == profile) {
                    if (n < *count)
                        cis[n] = &g_cih[h->gpu][h->gi][k];
                    n++;
                }
        if (n > *count)
            rc = NVML_ERROR_INSUFFICIENT_SIZE;
        *count = n;
    }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t h, unsigned int id, nvmlComputeInstance_t *out)
{
    ENTER();
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    nvmlReturn_t rc = gi_ok(h) ? NVML_ERROR_NOT_FOUND : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_ERROR_NOT_FOUND)
        for (int k = 0; k < SIM_MAX_CIS; k++)
            if (S()->gpu[h->gpu].gi[h->gi].ci[k].used && S()->gpu[h->gpu].gi[h->gi].ci[k].id == id) {
                *out = &g_cih[h->gpu][h->gi][k];
                rc = NVML_SUCCESS;
            }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info)
{
    ENTER();
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    nvmlReturn_t rc = ci_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        const struct sim_ci *ci = &S()->gpu[h->gpu].gi[h->gi].ci[h->ci];
        info->device = &g_phys[h->gpu];
        info->gpuInstance = &g_gih[h->gpu][h->gi];
        info->id = ci->id;
        info->profileId = ci->profile_id;
        info->placement.start = ci->start;
        info->placement.size = ci->size;
    }
    sim_unlock();
    return rc;
}
EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t h, nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(h, info);
}

EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t h)
{
    ENTER();
    LOCK();
    nvmlReturn_t rc = ci_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        struct sim_ci *ci = &S()->gpu[h->gpu].gi[h->gi].ci[h->ci];
        if (slot_in_use(h->gpu, h->gi + 1, (int)ci->id))
            rc = NVML_ERROR_IN_USE;
        else
            memset(ci, 0, sizeof *ci);
    }
    sim_unlock();
    return rc;
}
