/* Fake libnvidia-ml.so.1: NVML over the simulated node's shared state.  It owns MIG state
 * changes (mode, GPU and compute instances) with the real placement rules; the fake
 * nvidia-smi is a formatter over these calls. */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>

#include "migtable.h"
#include "simstate.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define EXPORT __attribute__((visibility("default")))
#define NO_ID 0xFFFFFFFFu
#define SAMPLE_PERIOD_NS 100000000ULL   /* process utilisation sample period */
#define SAMPLE_BUFFER_NS 10000000000ULL /* samples the driver keeps */
#define UTIL_WINDOW_NS 1000000000ULL    /* window of nvmlDeviceGetUtilizationRates */

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

static struct nvmlDevice_st g_phys[SIM_MAX_GPUS];
static struct nvmlDevice_st g_mig[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
static struct nvmlGpuInstance_st g_gih[SIM_MAX_GPUS][SIM_MAX_GIS];
static struct nvmlComputeInstance_st g_cih[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;

static struct sim_state *S(void) { return sim_state(); }

static nvmlReturn_t enter(const char *fn)
{
    if (g_refs <= 0)
        return NVML_ERROR_UNINITIALIZED;
    return (nvmlReturn_t)sim_fault(fn);
}

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

static int dev_ok(nvmlDevice_t d)
{
    if (!d || !S())
        return 0;
    if (d >= &g_phys[0] && d < &g_phys[SIM_MAX_GPUS])
        return d->gpu < (int)S()->ngpus;
    if ((void *)d >= (void *)&g_mig[0][0][0] && (void *)d < (void *)((char *)g_mig + sizeof g_mig)) {
        const struct sim_gpu *g = &S()->gpu[d->gpu];
        return g->mig_current && g->gi[d->gi].used && g->gi[d->gi].ci[d->ci].used;
    }
    return 0;
}

static int gi_ok(nvmlGpuInstance_t h)
{
    if (!h || !S() || (void *)h < (void *)&g_gih[0][0] || (void *)h >= (void *)((char *)g_gih + sizeof g_gih))
        return 0;
    return S()->gpu[h->gpu].gi[h->gi].used;
}

static int ci_ok(nvmlComputeInstance_t h)
{
    if (!h || !S() || (void *)h < (void *)&g_cih[0][0][0] || (void *)h >= (void *)((char *)g_cih + sizeof g_cih))
        return 0;
    const struct sim_gi *gi = &S()->gpu[h->gpu].gi[h->gi];
    return gi->used && gi->ci[h->ci].used;
}

#define CHECK_DEV(d)                               \
    do {                                           \
        if (!dev_ok(d))                            \
            return NVML_ERROR_INVALID_ARGUMENT;    \
    } while (0)

static int is_mig_handle(nvmlDevice_t d) { return d->gi >= 0; }
static int slot_of(nvmlDevice_t d) { return d->gi < 0 ? -1 : d->gi + 1; } /* -1: all targets */

/* ------------------------------------------------------------- init, system */

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refs == 0) {
        if (sim_attach() != 0) {
            fprintf(stderr, "tessera-sim libnvidia-ml: %s\n", sim_last_error());
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            int code = sim_fault("nvmlInit_v2");
            if (code)
                rc = (nvmlReturn_t)code;
        }
        if (rc == NVML_SUCCESS) {
            for (int g = 0; g < SIM_MAX_GPUS; g++) {
                g_phys[g] = (struct nvmlDevice_st){g, -1, -1};
                for (int i = 0; i < SIM_MAX_GIS; i++) {
                    g_gih[g][i] = (struct nvmlGpuInstance_st){g, i};
                    for (int c = 0; c < SIM_MAX_CIS; c++) {
                        g_mig[g][i][c] = (struct nvmlDevice_st){g, i, c};
                        g_cih[g][i][c] = (struct nvmlComputeInstance_st){g, i, c};
                    }
                }
            }
        }
    }
    if (rc == NVML_SUCCESS)
        g_refs++;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = g_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0 && --g_refs == 0)
        sim_detach(); /* the next nvmlInit reads TESSERA_SIM_NODE again */
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_out(char *dst, unsigned len, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
    ENTER();
    return copy_out(v, len, S()->driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len)
{
    ENTER();
    return copy_out(v, len, S()->nvml_version);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    ENTER();
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = S()->cuda_driver_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* ------------------------------------------------------------- devices */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    ENTER();
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = S()->ngpus;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    ENTER();
    if (!d || i >= S()->ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_phys[i];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    ENTER();
    if (!uuid || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    for (uint32_t g = 0; g < S()->ngpus && rc != NVML_SUCCESS; g++) {
        if (strcmp(S()->gpu[g].uuid, uuid) == 0) {
            *d = &g_phys[g];
            rc = NVML_SUCCESS;
        }
        for (int i = 0; i < SIM_MAX_GIS && rc != NVML_SUCCESS && S()->gpu[g].mig_current; i++)
            for (int c = 0; c < SIM_MAX_CIS && rc != NVML_SUCCESS; c++) {
                if (!S()->gpu[g].gi[i].used || !S()->gpu[g].gi[i].ci[c].used)
                    continue;
                char u[96];
                sim_mig_uuid((int)g, i, c, u, sizeof u);
                if (strcmp(u, uuid) == 0) {
                    *d = &g_mig[g][i][c];
                    rc = NVML_SUCCESS;
                }
            }
    }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d)
{
    ENTER();
    if (!bus || !d)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (uint32_t g = 0; g < S()->ngpus; g++)
        if (strcasecmp(S()->gpu[g].pci_bus_id, bus) == 0 || strcasecmp(S()->gpu[g].pci_bus_id + 4, bus) == 0) {
            *d = &g_phys[g];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) { return nvmlDeviceGetHandleByPciBusId_v2(bus, d); }

static const struct sim_mig_profile *gi_profile(int gpu, int gi)
{
    const struct sim_gpu *g = &S()->gpu[gpu];
    return sim_mig_profile(g->mig_table, g->gi[gi].profile);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    ENTER();
    CHECK_DEV(d);
    char buf[160];
    if (is_mig_handle(d)) {
        const struct sim_mig_profile *p = gi_profile(d->gpu, d->gi);
        snprintf(buf, sizeof buf, "%s MIG %s", S()->gpu[d->gpu].name, p ? p->name : "?");
    } else {
        sim_copy_str(buf, sizeof buf, S()->gpu[d->gpu].name);
    }
    return copy_out(name, len, buf);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    ENTER();
    CHECK_DEV(d);
    char buf[96];
    if (is_mig_handle(d))
        sim_mig_uuid(d->gpu, d->gi, d->ci, buf, sizeof buf);
    else
        sim_copy_str(buf, sizeof buf, S()->gpu[d->gpu].uuid);
    return copy_out(uuid, len, buf);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i)
{
    ENTER();
    CHECK_DEV(d);
    if (!i)
        return NVML_ERROR_INVALID_ARGUMENT;
    *i = (unsigned)d->gpu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m)
{
    ENTER();
    CHECK_DEV(d);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    *m = (unsigned)d->gpu;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    ENTER();
    CHECK_DEV(d);
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = S()->gpu[d->gpu].cc_major;
    *minor = S()->gpu[d->gpu].cc_minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    ENTER();
    CHECK_DEV(d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_gpu *g = &S()->gpu[d->gpu];
    memset(pci, 0, sizeof *pci);
    unsigned dom = 0, bus = 0, dev = 0;
    sscanf(g->pci_bus_id, "%x:%x:%x", &dom, &bus, &dev);
    sim_copy_str(pci->busId, sizeof pci->busId, g->pci_bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", dom & 0xffff, bus, dev);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = (g->pci_device_id & 0xffff0000u) | 0x10de;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

static void mem_of(nvmlDevice_t d, unsigned long long *total, unsigned long long *used)
{
    int slot = slot_of(d);
    *total = sim_capacity(d->gpu, slot < 0 ? 0 : slot);
    *used = sim_used_locked(d->gpu, slot);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    ENTER();
    CHECK_DEV(d);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    mem_of(d, &m->total, &m->used);
    sim_unlock();
    m->free = m->used >= m->total ? 0 : m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    ENTER();
    CHECK_DEV(d);
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    LOCK();
    mem_of(d, &m->total, &m->used);
    sim_unlock();
    m->reserved = 0;
    m->free = m->used >= m->total ? 0 : m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    ENTER();
    CHECK_DEV(d);
    if (!u)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_current)
        return NVML_ERROR_NOT_SUPPORTED; /* as on real MIG-enabled GPUs */
    LOCK();
    uint64_t now = sim_now_ns();
    uint64_t busy = sim_timeline_busy_locked(d->gpu, 0, NULL, now - UTIL_WINDOW_NS, now);
    sim_unlock();
    u->gpu = (unsigned)((busy * 100 + UTIL_WINDOW_NS / 2) / UTIL_WINDOW_NS);
    u->memory = 0;
    return NVML_SUCCESS;
}

/* Processes with a context or memory on the device (a MIG handle: on its GI only). */
static nvmlReturn_t processes(nvmlDevice_t d, unsigned *count, void *out, size_t stride, int with_ids)
{
    if (!count || (*count && !out))
        return NVML_ERROR_INVALID_ARGUMENT;
    LOCK();
    sim_observe_locked();
    unsigned n = 0;
    nvmlReturn_t rc = NVML_SUCCESS;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc *p = &S()->proc[i];
        if (!p->pid)
            continue;
        for (int t = 0; t < SIM_TARGETS; t++) {
            if (is_mig_handle(d) && t != d->gi + 1)
                continue;
            if (!p->ctx[d->gpu][t] && !p->mem[d->gpu][t])
                continue;
            if (n < *count) {
                unsigned char *rec = (unsigned char *)out + (size_t)n * stride;
                nvmlProcessInfo_v2_t info = {.pid = (unsigned)sim_reported_pid_locked(p), .usedGpuMemory = p->mem[d->gpu][t],
                                             .gpuInstanceId = NO_ID, .computeInstanceId = NO_ID};
                if (t > 0) {
                    info.gpuInstanceId = S()->gpu[d->gpu].gi[t - 1].id;
                    info.computeInstanceId = p->ci[d->gpu][t] >= 0 ? (unsigned)p->ci[d->gpu][t] : NO_ID;
                }
                if (with_ids) {
                    memcpy(rec, &info, sizeof info);
                } else {
                    nvmlProcessInfo_v1_t v1 = {info.pid, info.usedGpuMemory};
                    memcpy(rec, &v1, sizeof v1);
                }
            }
            n++;
        }
    }
    sim_unlock();
    if (n > *count)
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    *count = n;
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    ENTER();
    CHECK_DEV(d);
    return processes(d, c, p, sizeof *p, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *p)
{
    ENTER();
    CHECK_DEV(d);
    return processes(d, c, p, sizeof *p, 1);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p)
{
    ENTER();
    CHECK_DEV(d);
    return processes(d, c, p, sizeof *p, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    ENTER();
    CHECK_DEV(d);
    (void)p;
    if (!c)
        return NVML_ERROR_INVALID_ARGUMENT;
    *c = 0;
    return NVML_SUCCESS;
}

/* One sample per process with non-zero SM use: the driver samples every 100 ms and keeps
 * 10 s.  smUtil is the process's share of the device's time over the samples newer than
 * lastSeenTimeStamp (all kept samples when 0); timeStamp is the newest sample's time (µs,
 * CPU clock), to pass back as lastSeenTimeStamp. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *out,
                                                    unsigned int *count, unsigned long long last_seen)
{
    ENTER();
    CHECK_DEV(d);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d) || S()->gpu[d->gpu].mig_current)
        return NVML_ERROR_NOT_SUPPORTED;
    uint64_t now = sim_now_ns();
    uint64_t newest = now / SAMPLE_PERIOD_NS * SAMPLE_PERIOD_NS;
    uint64_t wall_newest = sim_mono_to_wall_us(newest);
    uint64_t oldest = newest > SAMPLE_BUFFER_NS ? newest - SAMPLE_BUFFER_NS : 0;
    if (last_seen) {
        if (last_seen >= wall_newest)
            return NVML_ERROR_NOT_FOUND;
        uint64_t back_ns = (wall_newest - last_seen) * 1000ULL;
        uint64_t from = newest > back_ns ? newest - back_ns : 0;
        from = (from + SAMPLE_PERIOD_NS - 1) / SAMPLE_PERIOD_NS * SAMPLE_PERIOD_NS; /* first sample after it */
        if (from > oldest)
            oldest = from;
    }
    /* A sample at time T covers (T - period, T]; samples after `oldest` cover (oldest - period + period...]. */
    uint64_t t0 = oldest, t1 = newest;
    if (t1 <= t0) {
        t0 = t1 > SAMPLE_PERIOD_NS ? t1 - SAMPLE_PERIOD_NS : 0;
    }
    LOCK();
    sim_observe_locked();
    nvmlProcessUtilizationSample_t tmp[SIM_MAX_PROCS];
    unsigned n = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc *p = &S()->proc[i];
        if (!p->pid)
            continue;
        uint64_t busy = sim_timeline_busy_locked(d->gpu, 0, p, t0, t1);
        if (!busy)
            continue;
        tmp[n].pid = (unsigned)sim_reported_pid_locked(p);
        tmp[n].timeStamp = wall_newest;
        tmp[n].smUtil = (unsigned)((busy * 100 + (t1 - t0) / 2) / (t1 - t0));
        tmp[n].memUtil = 0;
        tmp[n].encUtil = 0;
        tmp[n].decUtil = 0;
        n++;
    }
    sim_unlock();
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!out || *count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(out, tmp, n * sizeof *tmp);
    *count = n;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------- MIG mode */

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

EXPORT int tesseraSimSetFault(const char *fn, int count, int code, unsigned delay_us)
{
    if (sim_attach() != 0)
        return -1;
    return sim_fault_set(fn, count, code, delay_us);
}

/* ------------------------------------------------------------- GPU instances */

static const struct sim_mig_table *table_of(int gpu) { return sim_mig_table(S()->gpu[gpu].mig_table); }

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
        uint32_t start;
        while (place_gi(t, prof, mask, compute, have, -1, &start) == NVML_SUCCESS) {
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
    else if (slot < 0)
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
    sim_unlock();
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

static int slot_in_use(int gpu, int slot, int ci_id)
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

/* ------------------------------------------------------------- compute instances */

static nvmlReturn_t ci_shape(nvmlGpuInstance_t h, unsigned profile, uint32_t *c, uint32_t *starts, uint32_t *nstarts)
{
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
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    uint32_t c = 0, starts[8], ns = 0;
    if (rc == NVML_SUCCESS)
        rc = ci_shape(h, profile, &c, starts, &ns);
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
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    uint32_t c = 0, starts[8], ns = 0, n = 0;
    if (rc == NVML_SUCCESS)
        rc = ci_shape(h, profile, &c, starts, &ns);
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
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    uint32_t c = 0, starts[8], ns = 0;
    if (rc == NVML_SUCCESS)
        rc = ci_shape(h, profile, &c, starts, &ns);
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
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    uint32_t c = 0, starts[8], ns = 0, start = 0;
    if (rc == NVML_SUCCESS)
        rc = ci_shape(h, profile, &c, starts, &ns);
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
        }
    }
    sim_unlock();
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
    nvmlReturn_t rc = gi_ok(h) ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    uint32_t c = 0, starts[8], ns = 0;
    if (rc == NVML_SUCCESS)
        rc = ci_shape(h, profile, &c, starts, &ns);
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

/* ------------------------------------------------------------- MIG device handles */

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count)
{
    ENTER();
    CHECK_DEV(d);
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_table *t = is_mig_handle(d) ? NULL : table_of(d->gpu);
    *count = t ? t->compute_slices : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *out)
{
    ENTER();
    CHECK_DEV(d);
    if (!out || is_mig_handle(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!S()->gpu[d->gpu].mig_current)
        return NVML_ERROR_NOT_FOUND;
    LOCK();
    unsigned n = 0;
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    const struct sim_gpu *g = &S()->gpu[d->gpu];
    for (uint32_t id = 0; id < 15 && rc != NVML_SUCCESS; id++)
        for (int i = 0; i < SIM_MAX_GIS && rc != NVML_SUCCESS; i++) {
            if (!g->gi[i].used || g->gi[i].id != id)
                continue;
            for (uint32_t cid = 0; cid < SIM_MAX_CIS && rc != NVML_SUCCESS; cid++)
                for (int c = 0; c < SIM_MAX_CIS && rc != NVML_SUCCESS; c++)
                    if (g->gi[i].ci[c].used && g->gi[i].ci[c].id == cid && n++ == index) {
                        *out = &g_mig[d->gpu][i][c];
                        rc = NVML_SUCCESS;
                    }
        }
    sim_unlock();
    return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *out)
{
    ENTER();
    CHECK_DEV(d);
    if (!out || !is_mig_handle(d))
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = &g_phys[d->gpu];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig)
{
    ENTER();
    CHECK_DEV(d);
    if (!is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = (unsigned)is_mig_handle(d);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id)
{
    ENTER();
    CHECK_DEV(d);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_handle(d))
        return NVML_ERROR_NOT_SUPPORTED;
    *id = S()->gpu[d->gpu].gi[d->gi].id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id)
{
    ENTER();
    CHECK_DEV(d);
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig_handle(d))
        return NVML_ERROR_NOT_SUPPORTED;
    *id = S()->gpu[d->gpu].gi[d->gi].ci[d->ci].id;
    return NVML_SUCCESS;
}

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
