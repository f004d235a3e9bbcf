/* Fake libnvidia-ml.so.1: GPU instances.  Profiles, placements (the real default: the
 * highest free start slot), remaining capacity, create, list, look up and destroy, with the
 * rules of docs/mig.md; GPU instance IDs are the nodes of a binary tree over the memory
 * slices, as real GPUs report. */
#include "nvml_core.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static uint32_t used_mem_mask(int gpu)
{
    uint32_t m = 0;
    for (int i = 0; i < SIM_MAX_GIS; i++) {
        const struct sim_gi *gi = &S()->gpu[gpu].gi[i];
        const struct sim_mig_profile *p = gi->used ? gi_profile(gpu, i) : NULL;
        if (p)
            m |= ((1u << p->mem_slices) - 1) << gi->start;
    }
    return m;
}

static uint32_t used_compute(int gpu)
{
    uint32_t c = 0;
    for (int i = 0; i < SIM_MAX_GIS; i++) {
        const struct sim_gi *gi = &S()->gpu[gpu].gi[i];
        const struct sim_mig_profile *p = gi->used ? gi_profile(gpu, i) : NULL;
        if (p)
            c += p->compute_slices;
    }
    return c;
}

static uint32_t count_profile(int gpu, int prof)
{
    uint32_t n = 0;
    for (int i = 0; i < SIM_MAX_GIS; i++)
        n += S()->gpu[gpu].gi[i].used && S()->gpu[gpu].gi[i].profile == prof;
    return n;
}

/* How many more GIs of profile `prof` the GPU's JPEG and OFA engines (what its whole-GPU
 * profile holds) leave room for beside its GIs (UINT32_MAX: the profile takes none). A
 * media-extension profile (+me) takes the GPU's one OFA engine, so the driver refuses a
 * second +me GI (on an A30, 1g.6gb+me beside 2g.12gb+me) whatever the profiles' own maximum
 * counts say. */
static uint32_t media_room(int gpu, const struct sim_mig_table *t, int prof)
{
    uint32_t jpeg = 0, ofa = 0, all_jpeg = 0, all_ofa = 0, room = UINT32_MAX;
    for (uint32_t k = 0; k < t->nprofiles; k++) {
        if (t->profiles[k].jpeg > all_jpeg)
            all_jpeg = t->profiles[k].jpeg;
        if (t->profiles[k].ofa > all_ofa)
            all_ofa = t->profiles[k].ofa;
    }
    for (int i = 0; i < SIM_MAX_GIS; i++) {
        const struct sim_mig_profile *p = S()->gpu[gpu].gi[i].used ? gi_profile(gpu, i) : NULL;
        if (p) {
            jpeg += p->jpeg;
            ofa += p->ofa;
        }
    }
    const struct sim_mig_profile *p = &t->profiles[prof];
    uint32_t left_jpeg = jpeg < all_jpeg ? all_jpeg - jpeg : 0;
    uint32_t left_ofa = ofa < all_ofa ? all_ofa - ofa : 0;
    if (p->jpeg && left_jpeg / p->jpeg < room)
        room = left_jpeg / p->jpeg;
    if (p->ofa && left_ofa / p->ofa < room)
        room = left_ofa / p->ofa;
    return room;
}

/* Where a new GI of profile `prof` goes: the requested start, or -- without one -- the
 * highest free start slot, which is what the driver's default placement does (a 3g lands at
 * 4, a first 2g at 4, a first 1g at 6; docs/mig.md §1.5). */
static nvmlReturn_t place_gi(const struct sim_mig_table *t, int prof, uint32_t mask, uint32_t compute, uint32_t count,
                             int want_start, uint32_t *start)
{
    const struct sim_mig_profile *p = &t->profiles[prof];
    if (count >= p->max_count || compute + p->compute_slices > t->compute_slices)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    for (int k = (int)p->nstarts - 1; k >= 0; k--) {
        uint32_t s = p->starts[k];
        if (want_start >= 0 && s != (uint32_t)want_start)
            continue;
        uint32_t bits = ((1u << p->mem_slices) - 1) << s;
        if (!(mask & bits)) {
            *start = s;
            return NVML_SUCCESS;
        }
        if (want_start >= 0)
            return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    return want_start >= 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_INSUFFICIENT_RESOURCES;
}

/* nvmlDeviceGetGpuInstanceProfileInfo takes the NVML_GPU_INSTANCE_PROFILE_* index; every
 * other call takes the profile's unique ID (info.id, the "Profile ID" nvidia-smi prints). */
static nvmlReturn_t mig_profile_by_index(nvmlDevice_t d, unsigned index, int *prof)
{
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_table < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (index >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *prof = sim_mig_profile_by_nvml_id(S()->gpu[d->gpu].mig_table, index);
    return *prof < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

static nvmlReturn_t mig_profile_lookup(nvmlDevice_t d, unsigned profile_id, int *prof)
{
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_table < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    const struct sim_mig_table *t = table_of(d->gpu);
    for (uint32_t i = 0; i < t->nprofiles; i++)
        if (t->profiles[i].smi_id == profile_id) {
            *prof = (int)i;
            return NVML_SUCCESS;
        }
    return NVML_ERROR_INVALID_ARGUMENT;
}

static void fill_gi_profile(int gpu, const struct sim_mig_profile *p, nvmlGpuInstanceProfileInfo_v2_t *o, int with_name)
{
    o->id = p->smi_id;
    o->isP2pSupported = 0;
    o->sliceCount = p->compute_slices;
    o->instanceCount = p->max_count;
    o->multiprocessorCount = p->sm;
    o->copyEngineCount = p->ce;
    o->decoderCount = p->dec;
    o->encoderCount = p->enc;
    o->jpegCount = p->jpeg;
    o->ofaCount = p->ofa;
    o->memorySizeMB = p->memory_mib;
    (void)gpu;
    if (with_name)
        snprintf(o->name, sizeof o->name, "MIG %s", p->name);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info)
{
    ENTER();
    CHECK_DEV(d);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    int prof;
    nvmlReturn_t rc = mig_profile_by_index(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlGpuInstanceProfileInfo_v2_t v3 = {0};
    fill_gi_profile(d->gpu, &table_of(d->gpu)->profiles[prof], &v3, 0);
    info->id = v3.id;
    info->isP2pSupported = v3.isP2pSupported;
    info->sliceCount = v3.sliceCount;
    info->instanceCount = v3.instanceCount;
    info->multiprocessorCount = v3.multiprocessorCount;
    info->copyEngineCount = v3.copyEngineCount;
    info->decoderCount = v3.decoderCount;
    info->encoderCount = v3.encoderCount;
    info->jpegCount = v3.jpegCount;
    info->ofaCount = v3.ofaCount;
    info->memorySizeMB = v3.memorySizeMB;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    ENTER();
    CHECK_DEV(d);
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2 && info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    int prof;
    nvmlReturn_t rc = mig_profile_by_index(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlGpuInstanceProfileInfo_v2_t v2 = {.version = info->version};
    fill_gi_profile(d->gpu, &table_of(d->gpu)->profiles[prof], &v2, 1);
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        *info = v2;
        return NVML_SUCCESS;
    }
    /* v3 has no isP2pSupported and adds capabilities. */
    nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
    nvmlGpuInstanceProfileInfo_v3_t o = {.version = v2.version, .id = v2.id, .sliceCount = v2.sliceCount,
                                         .instanceCount = v2.instanceCount,
                                         .multiprocessorCount = v2.multiprocessorCount,
                                         .copyEngineCount = v2.copyEngineCount, .decoderCount = v2.decoderCount,
                                         .encoderCount = v2.encoderCount, .jpegCount = v2.jpegCount,
                                         .ofaCount = v2.ofaCount, .memorySizeMB = v2.memorySizeMB};
    memcpy(o.name, v2.name, sizeof o.name);
    *v3 = o;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profile,
                                                                  nvmlGpuInstancePlacement_t *pl, unsigned int *count)
{
    ENTER();
    CHECK_DEV(d);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    int prof;
    nvmlReturn_t rc = mig_profile_lookup(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_mig_profile *p = &table_of(d->gpu)->profiles[prof];
    if (!pl) {
        *count = p->nstarts;
        return NVML_SUCCESS;
    }
    if (*count < p->nstarts) {
        *count = p->nstarts;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (uint32_t i = 0; i < p->nstarts; i++) {
        pl[i].start = p->starts[i];
        pl[i].size = p->mem_slices;
    }
    *count = p->nstarts;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(nvmlDevice_t d, unsigned int profile,
                                                               nvmlGpuInstancePlacement_t *pl, unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(d, profile, pl, count);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t d, unsigned int profile, unsigned int *count)
{
    ENTER();
    CHECK_DEV(d);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    int prof;
    nvmlReturn_t rc = mig_profile_lookup(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    LOCK();
    const struct sim_mig_table *t = table_of(d->gpu);
    uint32_t n = 0;
    if (S()->gpu[d->gpu].mig_current) {
        uint32_t mask = used_mem_mask(d->gpu), compute = used_compute(d->gpu), have = count_profile(d->gpu, prof);
        uint32_t start, engines = media_room(d->gpu, t, prof);
        while (n < engines && place_gi(t, prof, mask, compute, have, -1, &start) == NVML_SUCCESS) {
            mask |= ((1u << t->profiles[prof].mem_slices) - 1) << start;
            compute += t->profiles[prof].compute_slices;
            have++;
            n++;
        }
    }
    sim_unlock();
    *count = n;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t d, unsigned profile, int want_start, unsigned want_size, nvmlGpuInstance_t *out)
{
    int prof;
    nvmlReturn_t rc = mig_profile_lookup(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_mig_table *t = table_of(d->gpu);
    if (want_start >= 0 && want_size != t->profiles[prof].mem_slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    struct sim_gpu *g = &S()->gpu[d->gpu];
    int slot = -1;
    for (int i = 0; i < SIM_MAX_GIS && slot < 0; i++)
        if (!g->gi[i].used)
            slot = i;
    uint32_t start = 0;
    if (!g->mig_current)
        rc = NVML_ERROR_NOT_SUPPORTED;
    else if (slot < 0 || media_room(d->gpu, t, prof) == 0)
        rc = NVML_ERROR_INSUFFICIENT_RESOURCES;
    else
        rc = place_gi(t, prof, used_mem_mask(d->gpu), used_compute(d->gpu), count_profile(d->gpu, prof), want_start, &start);
    if (rc == NVML_SUCCESS) {
        struct sim_gi *gi = &g->gi[slot];
        memset(gi, 0, sizeof *gi);
        gi->profile = prof;
        gi->start = start;
        gi->id = sim_gi_tree_id(t->mem_slices, start, t->profiles[prof].mem_slices);
        gi->serial = ++S()->serial;
        gi->used = 1;
        memset(&g->tl[slot + 1], 0, sizeof g->tl[slot + 1]);
        *out = &g_gih[d->gpu][slot];
    }
    uint32_t id = rc == NVML_SUCCESS ? g->gi[slot].id : 0;
    sim_unlock();
    if (rc == NVML_SUCCESS)
        sim_dev_publish_cap(d->gpu, id, -1); /* its access capability's device file */
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t d, unsigned int profile, nvmlGpuInstance_t *gi)
{
    ENTER();
    CHECK_DEV(d);
    if (!gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, profile, -1, 0, gi);
}

EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profile,
                                                             const nvmlGpuInstancePlacement_t *pl, nvmlGpuInstance_t *gi)
{
    ENTER();
    CHECK_DEV(d);
    if (!gi || !pl)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(d, profile, (int)pl->start, pl->size, gi);
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profile, nvmlGpuInstance_t *gis, unsigned int *count)
{
    ENTER();
    CHECK_DEV(d);
    if (!count || !gis)
        return NVML_ERROR_INVALID_ARGUMENT;
    int prof;
    nvmlReturn_t rc = mig_profile_lookup(d, profile, &prof);
    if (rc != NVML_SUCCESS)
        return rc;
    LOCK();
    unsigned n = 0;
    /* In GI-ID order, as the driver lists them. */
    for (uint32_t id = 0; id < 15; id++)
        for (int i = 0; i < SIM_MAX_GIS; i++) {
            const struct sim_gi *gi = &S()->gpu[d->gpu].gi[i];
            if (gi->used && gi->profile == prof && gi->id == id) {
                if (n < *count)
                    gis[n] = &g_gih[d->gpu][i];
                n++;
            }
        }
    sim_unlock();
    if (n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out)
{
    ENTER();
    CHECK_DEV(d);
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_table < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    LOCK();
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    for (int i = 0; i < SIM_MAX_GIS; i++)
        if (S()->gpu[d->gpu].gi[i].used && S()->gpu[d->gpu].gi[i].id == id) {
            *out = &g_gih[d->gpu][i];
            rc = NVML_SUCCESS;
        }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t h, nvmlGpuInstanceInfo_t *info)
{
    ENTER();
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        const struct sim_gi *gi = &S()->gpu[h->gpu].gi[h->gi];
        const struct sim_mig_profile *p = gi_profile(h->gpu, h->gi);
        info->device = &g_phys[h->gpu];
        info->id = gi->id;
        info->profileId = p->smi_id;
        info->placement.start = gi->start;
        info->placement.size = p->mem_slices;
    }
    sim_unlock();
    return rc;
}

int slot_in_use(int gpu, int slot, int ci_id)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc *p = &S()->proc[i];
        if (!p->pid || (!p->ctx[gpu][slot] && !p->mem[gpu][slot]))
            continue;
        if (ci_id < 0 || p->ci[gpu][slot] == ci_id)
            return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t h)
{
    ENTER();
    LOCK();
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS) {
        struct sim_gi *gi = &S()->gpu[h->gpu].gi[h->gi];
        for (int c = 0; c < SIM_MAX_CIS; c++)
            if (gi->ci[c].used)
                rc = NVML_ERROR_IN_USE;
        if (slot_in_use(h->gpu, h->gi + 1, -1))
            rc = NVML_ERROR_IN_USE;
        if (rc == NVML_SUCCESS)
            memset(gi, 0, sizeof *gi);
    }
    sim_unlock();
    return rc;
}
