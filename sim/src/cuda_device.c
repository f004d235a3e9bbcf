/* Fake libcuda.so.1: initialisation and devices.  cuInit enumerates the GPUs this process
 * sees (its device files, simdev.c; a MIG-enabled GPU: its visible MIG devices) as
 * CUDA_VISIBLE_DEVICES says, the way the real driver reads it; the device queries answer
 * from the node's description. */
#include "cuda_core.h"
#include "cuerrors.h"
#include "migtable.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static void add_dev(int gpu, int slot, int ci)
{
    struct sim_state *st = sim_state();
    struct sim_gpu *g = &st->gpu[gpu];
    struct sim_dev *d = &g_dev[g_ndev++];
    memset(d, 0, sizeof *d);
    d->gpu = gpu;
    d->slot = slot;
    d->ci = ci;
    if (slot == 0) {
        sim_copy_str(d->uuid, sizeof d->uuid, g->uuid);
        sim_copy_str(d->name, sizeof d->name, g->name);
        d->sm = (int)g->sm_count;
    } else {
        const struct sim_gi *gi = &g->gi[slot - 1];
        const struct sim_ci *c = &gi->ci[ci];
        const struct sim_mig_profile *pr = sim_mig_profile(g->mig_table, gi->profile);
        sim_mig_uuid(gpu, slot - 1, ci, d->uuid, sizeof d->uuid);
        snprintf(d->name, sizeof d->name, "%s MIG %s", g->name, pr ? pr->name : "?");
        d->sm = pr ? (int)(pr->sm * c->size / pr->compute_slices) : 0;
    }
    d->total = sim_capacity(gpu, slot);
    if (sim_uuid_bytes(d->uuid, d->uuid_bytes) != 0)
        memset(d->uuid_bytes, 0, sizeof d->uuid_bytes);
}

static int have_dev(int gpu, int slot, int ci)
{
    for (int i = 0; i < g_ndev; i++)
        if (g_dev[i].gpu == gpu && g_dev[i].slot == slot && g_dev[i].ci == ci)
            return 1;
    return 0;
}

static int mig_enumerated(void)
{
    for (int i = 0; i < g_ndev; i++)
        if (g_dev[i].slot > 0)
            return 1;
    return 0;
}

/* Add physical GPU `gpu` as CUDA sees it; 0 when it adds nothing usable. */
static int add_gpu(int gpu)
{
    struct sim_gpu *g = &sim_state()->gpu[gpu];
    if (!g->mig_current) {
        if (have_dev(gpu, 0, -1))
            return 0;
        add_dev(gpu, 0, -1);
        return 1;
    }
    int slots[64], cis[64];
    int n = sim_mig_devices(gpu, slots, cis, 64);
    /* CUDA enumerates a single MIG device per process. */
    if (n > 0 && !mig_enumerated())
        add_dev(gpu, slots[0], cis[0]);
    return 1;
}

static int match_mig_uuid(const char *want, int *gpu, int *slot, int *ci)
{
    struct sim_state *st = sim_state();
    int found = 0;
    for (int v = 0; v < sim_gpu_count(); v++) {
        int g = sim_gpu_at(v);
        if (!st->gpu[g].mig_current)
            continue;
        int slots[64], cis[64];
        int n = sim_mig_devices(g, slots, cis, 64);
        for (int i = 0; i < n; i++) {
            char u[96], legacy[160];
            sim_mig_uuid(g, slots[i] - 1, cis[i], u, sizeof u);
            snprintf(legacy, sizeof legacy, "MIG-%s/%u/%u", st->gpu[g].uuid,
                     st->gpu[g].gi[slots[i] - 1].id, st->gpu[g].gi[slots[i] - 1].ci[cis[i]].id);
            if (strncmp(u, want, strlen(want)) == 0 || strcmp(legacy, want) == 0) {
                *gpu = g;
                *slot = slots[i];
                *ci = cis[i];
                found++;
            }
        }
    }
    return found == 1;
}

static void enumerate(void)
{
    struct sim_state *st = sim_state();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    g_ndev = 0;
    if (!cvd) {
        for (int v = 0; v < sim_gpu_count() && g_ndev < SIM_MAX_DEVS; v++)
            add_gpu(sim_gpu_at(v));
        return;
    }
    /* Like the real driver: entries are read in order and parsing stops at the first
     * entry that is invalid, unknown, ambiguous or a duplicate. */
    char buf[1024];
    sim_copy_str(buf, sizeof buf, cvd);
    char *save = NULL;
    for (char *e = strtok_r(buf, ",", &save); e && g_ndev < SIM_MAX_DEVS; e = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*e))
            e++;
        char *end = e + strlen(e);
        while (end > e && isspace((unsigned char)end[-1]))
            *--end = '\0';
        if (isdigit((unsigned char)*e)) {
            char *stop = NULL;
            long idx = strtol(e, &stop, 10);
            if (*stop != '\0' || idx < 0 || idx >= (long)sim_gpu_count() || !add_gpu(sim_gpu_at((int)idx)))
                return;
        } else if (strncmp(e, "GPU-", 4) == 0) {
            int hit = -1, hits = 0;
            for (int v = 0; v < sim_gpu_count(); v++)
                if (strncmp(st->gpu[sim_gpu_at(v)].uuid, e, strlen(e)) == 0) {
                    hit = sim_gpu_at(v);
                    hits++;
                }
            if (hits != 1 || !add_gpu(hit))
                return;
        } else if (strncmp(e, "MIG-", 4) == 0) {
            int gpu, slot, ci;
            if (!match_mig_uuid(e, &gpu, &slot, &ci) || have_dev(gpu, slot, ci) || mig_enumerated())
                return;
            add_dev(gpu, slot, ci);
        } else {
            return;
        }
    }
}

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (!g_initialized) {
        if (sim_attach() != 0) {
            fprintf(stderr, "tessera-sim libcuda: %s\n", sim_last_error());
            g_init_result = CUDA_ERROR_NO_DEVICE;
        } else {
            int code = sim_fault("cuInit");
            if (code) {
                pthread_mutex_unlock(&g_mu);
                return (CUresult)code;
            }
            if (sim_lock(1) == 0) {
                enumerate();
                sim_unlock();
            }
            g_init_result = g_ndev > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
            g_initialized = g_ndev > 0;
        }
    }
    CUresult rc = g_initialized ? CUDA_SUCCESS : g_init_result;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_attach() == 0) {
        *v = sim_state()->cuda_driver_version;
    } else {
        *v = CUDA_VERSION;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    const char *str = sim_cu_error_string(e);
    *s = str;
    return str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s)
{
    if (!s)
        return CUDA_ERROR_INVALID_VALUE;
    const char *str = sim_cu_error_name(e);
    *s = str;
    return str ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    ENTER();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

/* The queries of one device d: `missing` (an output that is NULL or has no room) is
 * CUDA_ERROR_INVALID_VALUE, a device that is not there CUDA_ERROR_INVALID_DEVICE, else
 * `answer`. */
#define DEVICE_QUERY(fn, params, missing, answer)       \
    EXPORT CUresult fn params                           \
    {                                                   \
        ENTER();                                        \
        if (missing)                                    \
            return CUDA_ERROR_INVALID_VALUE;            \
        CHECK_DEV(d);                                   \
        answer;                                         \
        return CUDA_SUCCESS;                            \
    }
static const struct sim_gpu *gpu_of(CUdevice d) { return &sim_state()->gpu[g_dev[d].gpu]; }

DEVICE_QUERY(cuDeviceGetName, (char *name, int len, CUdevice d), !name || len <= 0,
             sim_copy_str(name, (size_t)len, g_dev[d].name))
DEVICE_QUERY(cuDeviceGetUuid, (CUuuid *u, CUdevice d), !u, memcpy(u->bytes, g_dev[d].uuid_bytes, 16))
DEVICE_QUERY(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice d), !bytes, *bytes = g_dev[d].total)
DEVICE_QUERY(cuDeviceComputeCapability, (int *major, int *minor, CUdevice d), !major || !minor,
             (*major = gpu_of(d)->cc_major, *minor = gpu_of(d)->cc_minor))
DEVICE_QUERY(cuDeviceGetPCIBusId, (char *bus, int len, CUdevice d), !bus || len <= 0,
             sim_copy_str(bus, (size_t)len, gpu_of(d)->pci_bus_id))
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

static int attr_value(const struct sim_dev *d, CUdevice_attribute a, int *ok)
{
    const struct sim_gpu *g = &sim_state()->gpu[d->gpu];
    unsigned bus = 0, dom = 0, devn = 0;
    sscanf(g->pci_bus_id, "%x:%x:%x", &dom, &bus, &devn);
    *ok = 1;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1410000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return d->sm;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return (int)bus;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return (int)devn;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return (int)dom;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 1593000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 50 * 1024 * 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return g->cc_major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return g->cc_minor;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
    default:
        if ((int)a > 0 && a < CU_DEVICE_ATTRIBUTE_MAX)
            return 0;
        *ok = 0;
        return 0;
    }
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute a, CUdevice d)
{
    ENTER();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    int ok = 0;
    int v = attr_value(&g_dev[d], a, &ok);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *d, const char *pciBusId)
{
    ENTER();
    if (!d || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < g_ndev; i++)
        if (strcasecmp(sim_state()->gpu[g_dev[i].gpu].pci_bus_id, pciBusId) == 0) {
            *d = i;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer)
{
    ENTER();
    if (!can)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    CHECK_DEV(peer);
    *can = 0;
    return CUDA_SUCCESS;
}
