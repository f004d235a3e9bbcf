/* Fake libnvidia-ml.so.1: devices.  Handles by index, UUID and PCI bus ID of the GPUs and
 * MIG devices this process sees (its device files, simdev.c); name, UUID, PCI and memory
 * information; utilisation and the processes on a device, from the node's shared state
 * (README.md, "Kernel time model"). */
#include "nvml_core.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#define NO_ID 0xFFFFFFFFu
#define SAMPLE_PERIOD_NS 100000000ULL   /* process utilisation sample period */
#define SAMPLE_BUFFER_NS 10000000000ULL /* samples the driver keeps */
#define UTIL_WINDOW_NS 1000000000ULL    /* window of nvmlDeviceGetUtilizationRates */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    ENTER();
    if (!n)
        return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)sim_gpu_count();
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    ENTER();
    if (!d || i >= (unsigned)sim_gpu_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_phys[sim_gpu_at((int)i)];
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
    for (int v = 0; v < sim_gpu_count() && rc != NVML_SUCCESS; v++) {
        int g = sim_gpu_at(v);
        if (strcmp(S()->gpu[g].uuid, uuid) == 0) {
            *d = &g_phys[g];
            rc = NVML_SUCCESS;
        }
        int slots[SIM_MAX_GIS * SIM_MAX_CIS], cis[SIM_MAX_GIS * SIM_MAX_CIS];
        int n = S()->gpu[g].mig_current ? sim_mig_devices(g, slots, cis, SIM_MAX_GIS * SIM_MAX_CIS) : 0;
        for (int k = 0; k < n && rc != NVML_SUCCESS; k++) {
            char u[96];
            sim_mig_uuid(g, slots[k] - 1, cis[k], u, sizeof u);
            if (strcmp(u, uuid) == 0) {
                *d = &g_mig[g][slots[k] - 1][cis[k]];
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
    for (int v = 0; v < sim_gpu_count(); v++) {
        int g = sim_gpu_at(v);
        if (strcasecmp(S()->gpu[g].pci_bus_id, bus) == 0 || strcasecmp(S()->gpu[g].pci_bus_id + 4, bus) == 0) {
            *d = &g_phys[g];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) { return nvmlDeviceGetHandleByPciBusId_v2(bus, d); }

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

/* The index is the GPU's place among those this process sees; the minor number is the
 * driver's own (its device file's), the same everywhere. */
DEVICE_QUERY(nvmlDeviceGetIndex, (nvmlDevice_t d, unsigned int *i), !i, 0, *i = (unsigned)sim_gpu_index(d->gpu))
DEVICE_QUERY(nvmlDeviceGetMinorNumber, (nvmlDevice_t d, unsigned int *m), !m, 0, *m = (unsigned)d->gpu)
DEVICE_QUERY(nvmlDeviceGetCudaComputeCapability, (nvmlDevice_t d, int *major, int *minor), !major || !minor, 0,
             (*major = S()->gpu[d->gpu].cc_major, *minor = S()->gpu[d->gpu].cc_minor))

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci)
{
    ENTER();
    CHECK_DEV(d);
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(&S()->gpu[d->gpu], pci);
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

/* Processes with a context or memory on the device (a MIG handle: on its GI only; a
 * MIG-enabled GPU: on the MIG devices this process sees). */
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
            if (!is_mig_handle(d) && t > 0 &&
                !sim_mig_visible(d->gpu, S()->gpu[d->gpu].gi[t - 1].id, p->ci[d->gpu][t]))
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

/* The versions differ in the record: v1 without the GPU and compute instance IDs. */
#define PROCESSES(fn, info_t, with_ids)                                           \
    EXPORT nvmlReturn_t fn(nvmlDevice_t d, unsigned int *c, info_t *p)            \
    {                                                                             \
        ENTER();                                                                  \
        CHECK_DEV(d);                                                             \
        return processes(d, c, p, sizeof *p, with_ids);                          \
    }
PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, 1)
PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, 1)
PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, 0)

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
        from = from / SAMPLE_PERIOD_NS * SAMPLE_PERIOD_NS; /* the next sample covers from here */
        if (from > oldest)
            oldest = from;
    }
    /* A sample at time T covers (T - period, T]: the samples newer than `oldest` cover
     * (oldest, newest]; none is newer when they meet. */
    uint64_t t0 = oldest, t1 = newest;
    if (t1 <= t0) { /* never with last_seen: it is older than newest, and floored */
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
