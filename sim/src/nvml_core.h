/* The fake NVML's internals, shared by its files (nvml_*.c): the handles it hands out, what
 * every entry point does first, and the helpers several of them use.  Not an API: hidden
 * inside libnvidia-ml.so.1.  NVML owns MIG state changes (mode, GPU and compute instances)
 * with the real placement rules; the fake nvidia-smi is a formatter over these calls. */
#ifndef TESSERA_SIM_NVML_CORE_H
#define TESSERA_SIM_NVML_CORE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "migtable.h"
#include "simstate.h"

#define EXPORT __attribute__((visibility("default")))

/* Everything below is hidden: the files reach each other's globals PC-relative. */
#pragma GCC visibility push(hidden)

/* ---- the handles (nvml_core.c), valid while what they name exists ---- */
struct nvmlDevice_st {
    int gpu;
    int gi;   /* GI slot, -1: the physical GPU */
    int ci;   /* CI slot */
};
struct nvmlGpuInstance_st {
    int gpu;
    int gi;
};
struct nvmlComputeInstance_st {
    int gpu;
    int gi;
    int ci;
};

extern struct nvmlDevice_st g_phys[SIM_MAX_GPUS];
extern struct nvmlDevice_st g_mig[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
extern struct nvmlGpuInstance_st g_gih[SIM_MAX_GPUS][SIM_MAX_GIS];
extern struct nvmlComputeInstance_st g_cih[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
extern int g_refs; /* nvmlInit calls not yet shut down */

static inline struct sim_state *S(void) { return sim_state(); }

static inline int dev_ok(nvmlDevice_t d)
{
    if (!d || !S())
        return 0;
    if (d >= &g_phys[0] && d < &g_phys[SIM_MAX_GPUS])
        return d->gpu < (int)S()->ngpus && sim_gpu_index(d->gpu) >= 0;
    if ((void *)d >= (void *)&g_mig[0][0][0] && (void *)d < (void *)((char *)g_mig + sizeof g_mig)) {
        const struct sim_gpu *g = &S()->gpu[d->gpu];
        return g->mig_current && g->gi[d->gi].used && g->gi[d->gi].ci[d->ci].used;
    }
    return 0;
}

static inline int gi_ok(nvmlGpuInstance_t h)
{
    if (!h || !S() || (void *)h < (void *)&g_gih[0][0] || (void *)h >= (void *)((char *)g_gih + sizeof g_gih))
        return 0;
    return S()->gpu[h->gpu].gi[h->gi].used;
}

static inline int ci_ok(nvmlComputeInstance_t h)
{
    if (!h || !S() || (void *)h < (void *)&g_cih[0][0][0] || (void *)h >= (void *)((char *)g_cih + sizeof g_cih))
        return 0;
    const struct sim_gi *gi = &S()->gpu[h->gpu].gi[h->gi];
    return gi->used && gi->ci[h->ci].used;
}

static inline int is_mig_handle(nvmlDevice_t d) { return d->gi >= 0; }
static inline int slot_of(nvmlDevice_t d) { return d->gi < 0 ? -1 : d->gi + 1; } /* -1: all targets */

/* ---- what every entry point does first ---- */
static inline nvmlReturn_t enter(const char *fn)
{
    if (g_refs <= 0)
        return NVML_ERROR_UNINITIALIZED;
    return (nvmlReturn_t)sim_fault(fn);
}

/* Not initialised, or a fault injected for this entry point (by its name): return that. */
#define ENTER()                                    \
    do {                                           \
        nvmlReturn_t enter_rc_ = enter(__func__);  \
        if (enter_rc_ != NVML_SUCCESS)             \
            return enter_rc_;                      \
    } while (0)

/* Lock with reaping; every NVML answer about processes or memory is current. */
#define LOCK()                                     \
    do {                                           \
        if (sim_lock(1) != 0)                      \
            return NVML_ERROR_UNKNOWN;             \
    } while (0)

#define CHECK_DEV(d)                               \
    do {                                           \
        if (!dev_ok(d))                            \
            return NVML_ERROR_INVALID_ARGUMENT;    \
    } while (0)

/* The queries of one device handle d that answer from what is known without the lock: a
 * handle that is not one, or `missing` (a NULL output), is NVML_ERROR_INVALID_ARGUMENT;
 * `unsupported` is NVML_ERROR_NOT_SUPPORTED; else `answer`.  (tools/gen_nvml_stubs.py reads
 * the rows of this macro as definitions.) */
#define DEVICE_QUERY(fn, params, missing, unsupported, answer)  \
    EXPORT nvmlReturn_t fn params                               \
    {                                                           \
        ENTER();                                                \
        CHECK_DEV(d);                                           \
        if (missing)                                            \
            return NVML_ERROR_INVALID_ARGUMENT;                 \
        if (unsupported)                                        \
            return NVML_ERROR_NOT_SUPPORTED;                    \
        answer;                                                 \
        return NVML_SUCCESS;                                    \
    }

/* ---- helpers several files use ---- */
/* Copy a string out to a caller's buffer of len bytes. */
static inline nvmlReturn_t copy_out(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* A GPU's PCI information as nvmlDeviceGetPciInfo_v3 reports it (sub-system ID included). */
static inline void fill_pci(const struct sim_gpu *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    unsigned dom = 0, bus = 0, dev = 0;
    if (sscanf(g->pci_bus_id, "%x:%x:%x", &dom, &bus, &dev) != 3)
        dom = bus = dev = 0;
    sim_copy_str(pci->busId, sizeof pci->busId, g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", dom & 0xffff, bus & 0xff, dev & 0xff);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = (g->pci_device_id & 0xffff0000u) | 0x10de;
}

/* The profile of GPU instance slot gi of a GPU, and the GPU's MIG table. */
static inline const struct sim_mig_profile *gi_profile(int gpu, int gi)
{
    const struct sim_gpu *g = &S()->gpu[gpu];
    return sim_mig_profile(g->mig_table, g->gi[gi].profile);
}
static inline const struct sim_mig_table *table_of(int gpu) { return sim_mig_table(S()->gpu[gpu].mig_table); }

/* nvml_gpu_instance.c: does a process use target `slot` of a GPU (and compute instance
 * ci_id; -1: any)?  Caller holds the lock. */
int slot_in_use(int gpu, int slot, int ci_id);

#pragma GCC visibility pop
#endif
