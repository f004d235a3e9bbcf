/* Fake libcuda.so.1: the CUDA driver API over the simulated node's shared state.
 *
 * Memory is really accounted against the device (or MIG instance) in the shared state;
 * device pointers are real host mappings (MAP_NORESERVE) so copies work; kernels do not
 * compute but occupy the device timeline for a modelled time (see the kernel time model
 * in simstate.c and README.md). */
#define _GNU_SOURCE
#define CUDA_ENABLE_DEPRECATED 1
#include "cuda_core.h"
#include "cuerrors.h"
#include "migtable.h"
#include "simstate.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAGIC_CTX 0x43545831u
#define MAGIC_STREAM 0x53545231u
#define MAGIC_EVENT 0x45564e31u
#define MAGIC_MOD 0x4d4f4431u
#define MAGIC_FUNC 0x46554e31u
#define MAGIC_POOL 0x504f4f31u
#define MAGIC_GRAPH 0x47525031u
#define MAGIC_GEXEC 0x47455831u
#define MAGIC_NODE 0x4e4f4431u
#define VMM_GRANULARITY (2ULL * MIB)
#define PITCH_ALIGN 512

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_initialized;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static struct sim_dev g_dev[SIM_MAX_DEVS];
static int g_ndev;
static unsigned long long g_next_id = 1;

static __thread CUcontext t_stack[32];
static __thread int t_depth;

/* ------------------------------------------------------------- handle registry */

struct reg {
    void **items;
    size_t n, cap;
};
static struct reg r_ctx, r_stream, r_event, r_mod, r_func, r_pool, r_graph, r_gexec, r_node;

static int reg_add(struct reg *r, void *p)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        void **ni = realloc(r->items, cap * sizeof *ni);
        if (!ni)
            return -1;
        r->items = ni;
        r->cap = cap;
    }
    r->items[r->n++] = p;
    return 0;
}

static int reg_has(const struct reg *r, const void *p)
{
    if (!p)
        return 0;
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i] == p)
            return 1;
    return 0;
}

static void reg_del(struct reg *r, const void *p)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->items[i] == p) {
            r->items[i] = r->items[--r->n];
            return;
        }
}

/* ------------------------------------------------------------- allocations */

enum alloc_kind {
    A_DEVICE, A_PITCH, A_MANAGED, A_ASYNC, A_ARRAY, A_HOST, A_VMM_HANDLE, A_VA_RANGE,
    A_HOST_REG,  /* registered (page-locked) host memory: the caller's, never unmapped here */
    A_MIPMAP,
};

struct alloc {
    uintptr_t ptr;
    size_t size;        /* mapped size */
    uint64_t charged;   /* bytes charged to the device */
    enum alloc_kind kind;
    int dev;
    CUcontext ctx;
    CUmemoryPool pool;
    int maps;           /* VMM handle: live mappings; VA range: mapped bytes */
    int released;       /* VMM handle released while still mapped */
    uintptr_t handle;   /* VMM mapping: the handle it maps */
};

static struct alloc *g_alloc;
static size_t g_nalloc, g_capalloc;
static uintptr_t g_next_handle = 0x1000;

static struct alloc *alloc_add(void)
{
    if (g_nalloc == g_capalloc) {
        size_t cap = g_capalloc ? g_capalloc * 2 : 256;
        struct alloc *na = realloc(g_alloc, cap * sizeof *na);
        if (!na)
            return NULL;
        g_alloc = na;
        g_capalloc = cap;
    }
    struct alloc *a = &g_alloc[g_nalloc++];
    memset(a, 0, sizeof *a);
    return a;
}

static struct alloc *alloc_find(uintptr_t p, enum alloc_kind kind)
{
    for (size_t i = 0; i < g_nalloc; i++)
        if (g_alloc[i].ptr == p && g_alloc[i].kind == kind)
            return &g_alloc[i];
    return NULL;
}

/* Allocation containing [p, p+n) that the device can address. */
static struct alloc *alloc_containing(uintptr_t p, size_t n)
{
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *a = &g_alloc[i];
        if (a->kind == A_VMM_HANDLE || a->kind == A_ARRAY || a->kind == A_MIPMAP)
            continue;
        if (p >= a->ptr && p - a->ptr <= a->size && n <= a->size - (p - a->ptr))
            return a;
    }
    return NULL;
}

static void alloc_remove(struct alloc *a) { *a = g_alloc[--g_nalloc]; }

/* Fill a new allocation record. */
static void alloc_set(struct alloc *a, uintptr_t ptr, size_t size, uint64_t charged, enum alloc_kind kind,
                      int dev, CUcontext ctx)
{
    a->ptr = ptr;
    a->size = size;
    a->charged = charged;
    a->kind = kind;
    a->dev = dev;
    a->ctx = ctx;
}

static void *map_bytes(size_t n, int prot)
{
    void *p = mmap(NULL, n ? n : 1, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* ------------------------------------------------------------- small helpers */

static CUresult enter(const char *fn)
{
    if (!g_initialized)
        return g_init_result == CUDA_SUCCESS ? CUDA_ERROR_NOT_INITIALIZED : g_init_result;
    int code = sim_fault(fn);
    return (CUresult)code;
}

#define ENTER()                                  \
    do {                                         \
        CUresult enter_rc_ = enter(__func__);    \
        if (enter_rc_ != CUDA_SUCCESS)           \
            return enter_rc_;                    \
    } while (0)

static CUcontext current_ctx(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

static int ctx_usable(CUcontext c)
{
    return c && reg_has(&r_ctx, c) && (!c->primary || c->active);
}

/* Current context or CUDA_ERROR_INVALID_CONTEXT. Caller holds g_mu. */
static CUresult need_ctx(CUcontext *out)
{
    CUcontext c = current_ctx();
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_usable(c))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = c;
    return CUDA_SUCCESS;
}

static struct sim_dev *dev_of(CUcontext c) { return &g_dev[c->dev]; }

static CUresult charge(int dev, uint64_t bytes)
{
    if (sim_lock(0) != 0)
        return CUDA_ERROR_UNKNOWN;
    int rc = sim_charge_locked(g_dev[dev].gpu, g_dev[dev].slot, bytes);
    sim_unlock();
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void uncharge(int dev, uint64_t bytes)
{
    if (bytes == 0 || sim_lock(0) != 0)
        return;
    sim_uncharge_locked(g_dev[dev].gpu, g_dev[dev].slot, bytes);
    sim_unlock();
}

static int stream_ok(CUstream s) { return reg_has(&r_stream, s); }

/* ------------------------------------------------------------- init, devices */

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

/* MIG devices of a GPU in enumeration order (GI id, then CI id). */
static int mig_devices(int gpu, int *slots, int *cis, int cap)
{
    struct sim_gpu *g = &sim_state()->gpu[gpu];
    int n = 0;
    for (uint32_t id = 0; id < 15; id++)
        for (int k = 0; k < SIM_MAX_GIS; k++) {
            struct sim_gi *gi = &g->gi[k];
            if (!gi->used || gi->id != id)
                continue;
            for (uint32_t cid = 0; cid < SIM_MAX_CIS; cid++)
                for (int c = 0; c < SIM_MAX_CIS; c++)
                    if (gi->ci[c].used && gi->ci[c].id == cid && n < cap) {
                        slots[n] = k + 1;
                        cis[n] = c;
                        n++;
                    }
        }
    return n;
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
    int n = mig_devices(gpu, slots, cis, 64);
    /* CUDA enumerates a single MIG device per process. */
    if (n > 0 && !mig_enumerated())
        add_dev(gpu, slots[0], cis[0]);
    return 1;
}

static int match_mig_uuid(const char *want, int *gpu, int *slot, int *ci)
{
    struct sim_state *st = sim_state();
    int found = 0;
    for (uint32_t g = 0; g < st->ngpus; g++) {
        if (!st->gpu[g].mig_current)
            continue;
        int slots[64], cis[64];
        int n = mig_devices((int)g, slots, cis, 64);
        for (int i = 0; i < n; i++) {
            char u[96], legacy[160];
            sim_mig_uuid((int)g, slots[i] - 1, cis[i], u, sizeof u);
            snprintf(legacy, sizeof legacy, "MIG-%s/%u/%u", st->gpu[g].uuid,
                     st->gpu[g].gi[slots[i] - 1].id, st->gpu[g].gi[slots[i] - 1].ci[cis[i]].id);
            if (strncmp(u, want, strlen(want)) == 0 || strcmp(legacy, want) == 0) {
                *gpu = (int)g;
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
        for (uint32_t g = 0; g < st->ngpus && g_ndev < SIM_MAX_DEVS; g++)
            add_gpu((int)g);
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
            if (*stop != '\0' || idx < 0 || idx >= (long)st->ngpus || !add_gpu((int)idx))
                return;
        } else if (strncmp(e, "GPU-", 4) == 0) {
            int hit = -1, hits = 0;
            for (uint32_t g = 0; g < st->ngpus; g++)
                if (strncmp(st->gpu[g].uuid, e, strlen(e)) == 0) {
                    hit = (int)g;
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

#define CHECK_DEV(d)                             \
    do {                                         \
        if ((d) < 0 || (d) >= g_ndev)            \
            return CUDA_ERROR_INVALID_DEVICE;    \
    } while (0)

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    ENTER();
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    sim_copy_str(name, (size_t)len, g_dev[d].name);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    ENTER();
    if (!u)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    memcpy(u->bytes, g_dev[d].uuid_bytes, 16);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    ENTER();
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    *bytes = g_dev[d].total;
    return CUDA_SUCCESS;
}

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

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice d)
{
    ENTER();
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    *major = sim_state()->gpu[g_dev[d].gpu].cc_major;
    *minor = sim_state()->gpu[g_dev[d].gpu].cc_minor;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice d)
{
    ENTER();
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    sim_copy_str(pciBusId, (size_t)len, sim_state()->gpu[g_dev[d].gpu].pci_bus_id);
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

/* ------------------------------------------------------------- contexts */

static CUresult stream_new(CUcontext c, unsigned flags, int prio, CUstream *out);
static void stream_free(CUstream s);
static void free_ctx_resources(CUcontext c);

/* Register this process's context on the device in the shared state. */
static CUresult ctx_attach_node(int dev)
{
    struct sim_dev *d = &g_dev[dev];
    if (sim_lock(0) != 0)
        return CUDA_ERROR_UNKNOWN;
    struct sim_proc *self = sim_self_locked();
    CUresult rc = CUDA_SUCCESS;
    if (!self) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uint64_t ctx_bytes = sim_state()->context_mib * MIB;
        if (ctx_bytes && sim_charge_locked(d->gpu, d->slot, ctx_bytes) != 0) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            self->ctx[d->gpu][d->slot]++;
            self->ci[d->gpu][d->slot] = d->ci >= 0 ? (int32_t)sim_state()->gpu[d->gpu].gi[d->slot - 1].ci[d->ci].id : -1;
        }
    }
    sim_unlock();
    return rc;
}

static void ctx_detach_node(int dev)
{
    struct sim_dev *d = &g_dev[dev];
    if (sim_lock(0) != 0)
        return;
    struct sim_proc *self = sim_self_locked();
    if (self) {
        if (self->ctx[d->gpu][d->slot] > 0)
            self->ctx[d->gpu][d->slot]--;
        sim_uncharge_locked(d->gpu, d->slot, sim_state()->context_mib * MIB);
    }
    sim_unlock();
}

static CUresult ctx_new(int dev, int primary, unsigned flags, CUcontext *out)
{
    CUcontext c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->magic = MAGIC_CTX;
    c->dev = dev;
    c->primary = primary;
    c->flags = flags;
    c->id = g_next_id++;
    if (reg_add(&r_ctx, c) != 0) {
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (stream_new(c, 0, 0, &c->null_stream) != CUDA_SUCCESS) {
        reg_del(&r_ctx, c);
        free(c);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_activate(CUcontext c)
{
    CUresult rc = ctx_attach_node(c->dev);
    if (rc == CUDA_SUCCESS)
        c->active = 1;
    return rc;
}

static void ctx_deactivate(CUcontext c)
{
    if (!c->active)
        return;
    free_ctx_resources(c);
    ctx_detach_node(c->dev);
    c->active = 0;
    c->last_end = 0;
}

static void drop_from_stacks(CUcontext c)
{
    /* Only this thread's stack is reachable; other threads see a destroyed context. */
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == c)
            t_stack[i] = NULL;
    while (t_depth > 0 && t_stack[t_depth - 1] == NULL)
        t_depth--;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    struct sim_dev *sd = &g_dev[d];
    if (!sd->primary)
        rc = ctx_new(d, 1, 0, &sd->primary);
    if (rc == CUDA_SUCCESS && !sd->primary->active)
        rc = ctx_activate(sd->primary);
    if (rc == CUDA_SUCCESS) {
        sd->primary->refcount++;
        *pctx = sd->primary;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    CUcontext c = g_dev[d].primary;
    if (!c || c->refcount == 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refcount == 0) {
        ctx_deactivate(c);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = g_dev[d].primary;
    if (c) {
        ctx_deactivate(c);
        c->refcount = 0;
        c->flags = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    ENTER();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = g_dev[d].primary;
    *flags = c ? c->flags : 0;
    *active = c ? c->active : 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice d, unsigned int flags)
{
    ENTER();
    CHECK_DEV(d);
    if (flags & ~(unsigned)(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX | CU_CTX_COREDUMP_ENABLE |
                            CU_CTX_USER_COREDUMP_ENABLE | CU_CTX_SYNC_MEMOPS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!g_dev[d].primary)
        rc = ctx_new(d, 1, 0, &g_dev[d].primary);
    if (rc == CUDA_SUCCESS)
        g_dev[d].primary->flags = flags;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult ctx_create(CUcontext *pctx, unsigned flags, CUdevice d)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = ctx_new(d, 0, flags, &c);
    if (rc == CUDA_SUCCESS) {
        rc = ctx_activate(c);
        if (rc != CUDA_SUCCESS) {
            stream_free(c->null_stream);
            reg_del(&r_ctx, c);
            free(c);
        }
    }
    if (rc == CUDA_SUCCESS) {
        if (t_depth < 32)
            t_stack[t_depth++] = c;
        else
            t_stack[t_depth - 1] = c;
        *pctx = c;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice d) { return ctx_create(pctx, flags, d); }

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice d)
{
    if (n < 0 || (n > 0 && !p))
        return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, d);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice d)
{
    (void)p;
    return ctx_create(pctx, flags, d);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext c)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!c || !reg_has(&r_ctx, c) || c->primary) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        ctx_deactivate(c);
        drop_from_stacks(c);
        stream_free(c->null_stream);
        reg_del(&r_ctx, c);
        c->magic = 0;
        free(c);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!ctx_usable(c))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (t_depth >= 32)
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        t_stack[t_depth++] = c;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    ENTER();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c)
{
    ENTER();
    if (c == NULL) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_mu);
    int ok = reg_has(&r_ctx, c);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        *d = c->dev;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    ENTER();
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        *flags = c->flags;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxGetId(CUcontext c, unsigned long long *id)
{
    ENTER();
    if (!id)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!c)
        rc = need_ctx(&c);
    else if (!ctx_usable(c))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS)
        *id = c->id;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxGetApiVersion(CUcontext c, unsigned int *v)
{
    ENTER();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!c)
        rc = need_ctx(&c);
    else if (!ctx_usable(c))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS)
        *v = 3020;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    ENTER();
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetLimit(size_t *v, CUlimit limit)
{
    ENTER();
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    switch (limit) {
    case CU_LIMIT_STACK_SIZE: *v = 1024; break;
    case CU_LIMIT_PRINTF_FIFO_SIZE: *v = 1 << 20; break;
    case CU_LIMIT_MALLOC_HEAP_SIZE: *v = 8 << 20; break;
    default: return CUDA_ERROR_UNSUPPORTED_LIMIT;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t v)
{
    ENTER();
    (void)v;
    if (limit > CU_LIMIT_MAX_L2_FETCH_GRANULARITY && limit != CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_UNSUPPORTED_LIMIT;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    uint64_t until = rc == CUDA_SUCCESS ? c->last_end : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        sim_sleep_until(until);
    return rc;
}

/* ------------------------------------------------------------- streams, events */

static CUresult stream_new(CUcontext c, unsigned flags, int prio, CUstream *out)
{
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->ring_cap = sim_state()->launch_queue_depth;
    s->ring = calloc(s->ring_cap, sizeof *s->ring);
    if (!s->ring || reg_add(&r_stream, s) != 0) {
        free(s->ring);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->magic = MAGIC_STREAM;
    s->ctx = c;
    s->flags = flags;
    s->priority = prio;
    s->id = g_next_id++;
    *out = s;
    return CUDA_SUCCESS;
}

static void stream_free(CUstream s)
{
    if (!s)
        return;
    reg_del(&r_stream, s);
    s->magic = 0;
    free(s->ring);
    free(s);
}

static void pool_trim(CUmemoryPool p, uint64_t keep);

/* After a synchronisation the driver returns pool memory above the release threshold. */
static void trim_pools_of(int dev)
{
    for (size_t i = 0; i < r_pool.n; i++) {
        CUmemoryPool p = r_pool.items[i];
        if (p->dev == dev)
            pool_trim(p, p->release_threshold);
    }
}

EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = stream_new(c, flags, 0, ph);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (priority > 0)
        priority = 0;
    if (priority < -5)
        priority = -5;
    if (rc == CUDA_SUCCESS)
        rc = stream_new(c, flags, priority, ph);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!stream_ok(s) || s == s->ctx->null_stream)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else
        stream_free(s);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Resolve a stream argument: its end time and device. */
static CUresult stream_lookup(CUstream s, CUstream *out)
{
    CUcontext c = NULL;
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
        CUresult rc = need_ctx(&c);
        if (rc != CUDA_SUCCESS)
            return rc;
        *out = c->null_stream;
        return CUDA_SUCCESS;
    }
    if (!stream_ok(s))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_usable(s->ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = s;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    uint64_t until = 0;
    int dev = 0;
    if (rc == CUDA_SUCCESS) {
        /* The legacy default stream waits for every blocking stream of its context. */
        until = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        dev = st->ctx->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_sleep_until(until);
    pthread_mutex_lock(&g_mu);
    trim_pools_of(dev);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery(CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS) {
        uint64_t until = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        rc = sim_now_ns() >= until ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    ENTER();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS)
        *pctx = st->ctx;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamGetFlags(CUstream s, unsigned int *flags)
{
    ENTER();
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS)
        *flags = st->flags;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamGetPriority(CUstream s, int *prio)
{
    ENTER();
    if (!prio)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS)
        *prio = st->priority;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    ENTER();
    if (!ph || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS) {
        CUevent e = calloc(1, sizeof *e);
        if (!e || reg_add(&r_event, e) != 0) {
            free(e);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = MAGIC_EVENT;
            e->ctx = c;
            e->flags = flags;
            *ph = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    CUstream st = NULL;
    if (rc == CUDA_SUCCESS)
        rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS) {
        uint64_t now = sim_now_ns();
        uint64_t end = st == st->ctx->null_stream ? st->ctx->last_end : st->last_end;
        e->t = end > now ? end : now;
        e->recorded = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags)
{
    (void)flags;
    return cuEventRecord(e, s);
}

EXPORT CUresult cuEventQuery(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && e->recorded && sim_now_ns() < e->t)
        rc = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventSynchronize(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    uint64_t t = rc == CUDA_SUCCESS && e->recorded ? e->t : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        sim_sleep_until(t);
    return rc;
}

EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    ENTER();
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    if (!reg_has(&r_event, a) || !reg_has(&r_event, b))
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (sim_now_ns() < a->t || sim_now_ns() < b->t)
        rc = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)b->t - (int64_t)a->t) / 1e6);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_event, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        reg_del(&r_event, e);
        e->magic = 0;
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    ENTER();
    (void)flags;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = reg_has(&r_event, e) ? stream_lookup(s, &st) : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && e->recorded && e->t > st->last_end)
        st->last_end = e->t;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ------------------------------------------------------------- modules */

/* Parse a module image.  Two forms:
 *   the simulator's own:  first line ".tessera_sim_module", then lines
 *       kernel NAME [ns_per_block=N] [fixed_ns=N] [cost_param=I]
 *   PTX text: every ".entry NAME" becomes a kernel with the node's default cost. */
static CUresult parse_module(const char *img, size_t len, CUmodule m)
{
    struct sim_kernel ks[256];
    int n = 0;
    uint64_t dflt = sim_state()->default_ns_per_block;
    if (len >= 4 && memcmp(img, "\177ELF", 4) == 0)
        return CUDA_ERROR_INVALID_IMAGE; /* cubin/fatbin: no machine code runs here */
    char *text = strndup(img, len);
    if (!text)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int own = strncmp(text, ".tessera_sim_module", 19) == 0;
    int ptx = strstr(text, ".entry") != NULL;
    CUresult rc = (own || ptx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); rc == CUDA_SUCCESS && line; line = strtok_r(NULL, "\n", &save)) {
        struct sim_kernel k = {.ns_per_block = dflt, .cost_param = -1};
        if (own) {
            char *tok_save = NULL;
            char *tok = strtok_r(line, " \t\r", &tok_save);
            if (!tok || strcmp(tok, "kernel") != 0)
                continue;
            tok = strtok_r(NULL, " \t\r", &tok_save);
            if (!tok) {
                rc = CUDA_ERROR_INVALID_IMAGE;
                break;
            }
            sim_copy_str(k.name, sizeof k.name, tok);
            while ((tok = strtok_r(NULL, " \t\r", &tok_save))) {
                unsigned long long v = 0;
                int iv = 0;
                if (sscanf(tok, "ns_per_block=%llu", &v) == 1)
                    k.ns_per_block = v;
                else if (sscanf(tok, "fixed_ns=%llu", &v) == 1)
                    k.fixed_ns = v;
                else if (sscanf(tok, "cost_param=%d", &iv) == 1 && iv >= 0 && iv < 64)
                    k.cost_param = iv;
                else
                    rc = CUDA_ERROR_INVALID_IMAGE;
            }
        } else {
            char *p = strstr(line, ".entry");
            if (!p)
                continue;
            p += 6;
            while (*p == ' ' || *p == '\t')
                p++;
            size_t l = strcspn(p, " \t(\r{");
            if (l == 0 || l >= sizeof k.name) {
                rc = CUDA_ERROR_INVALID_PTX;
                break;
            }
            memcpy(k.name, p, l);
            k.name[l] = '\0';
        }
        if (n >= 256) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        ks[n++] = k;
    }
    free(text);
    if (rc != CUDA_SUCCESS)
        return rc;
    m->funcs = calloc((size_t)(n ? n : 1), sizeof *m->funcs);
    if (!m->funcs)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        m->funcs[i].magic = MAGIC_FUNC;
        m->funcs[i].mod = m;
        m->funcs[i].k = ks[i];
        if (reg_add(&r_func, &m->funcs[i]) != 0) {
            for (int j = 0; j < i; j++)
                reg_del(&r_func, &m->funcs[j]);
            free(m->funcs);
            m->funcs = NULL;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    m->nfuncs = n;
    return CUDA_SUCCESS;
}

static CUresult module_load(CUmodule *pm, const char *img, size_t len)
{
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    CUmodule m = NULL;
    if (rc == CUDA_SUCCESS) {
        m = calloc(1, sizeof *m);
        rc = m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_SUCCESS) {
        m->magic = MAGIC_MOD;
        m->ctx = c;
        rc = parse_module(img, len, m);
    }
    if (rc == CUDA_SUCCESS && reg_add(&r_mod, m) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        *pm = m;
    } else if (m) {
        for (int i = 0; i < m->nfuncs; i++)
            reg_del(&r_func, &m->funcs[i]);
        free(m->funcs);
        free(m);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuModuleLoadData(CUmodule *pm, const void *image)
{
    ENTER();
    if (!pm || !image)
        return CUDA_ERROR_INVALID_VALUE;
    const char *img = image;
    size_t len = memcmp(img, "\177ELF", 4) == 0 ? 4 : strlen(img);
    return module_load(pm, img, len);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *pm, const void *image, unsigned int n, CUjit_option *o, void **v)
{
    (void)n;
    (void)o;
    (void)v;
    return cuModuleLoadData(pm, image);
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule *pm, const void *image) { return cuModuleLoadData(pm, image); }

EXPORT CUresult cuModuleLoad(CUmodule *pm, const char *fname)
{
    ENTER();
    if (!pm || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0 || sb.st_size > (1 << 26)) {
        close(fd);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf)
        return CUDA_ERROR_OUT_OF_MEMORY;
    buf[got] = '\0';
    CUresult rc = module_load(pm, buf, got);
    free(buf);
    return rc;
}

static void module_free(CUmodule m)
{
    for (int i = 0; i < m->nfuncs; i++) {
        reg_del(&r_func, &m->funcs[i]);
        m->funcs[i].magic = 0;
    }
    reg_del(&r_mod, m);
    free(m->funcs);
    m->magic = 0;
    free(m);
}

EXPORT CUresult cuModuleUnload(CUmodule m)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_mod, m) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        module_free(m);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *pf, CUmodule m, const char *name)
{
    ENTER();
    if (!pf || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_mod, m) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_ERROR_NOT_FOUND)
        for (int i = 0; i < m->nfuncs; i++)
            if (strcmp(m->funcs[i].k.name, name) == 0) {
                *pf = &m->funcs[i];
                rc = CUDA_SUCCESS;
                break;
            }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction f)
{
    ENTER();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 80; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 80; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 49152; break;
    default:
        if ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
            return CUDA_ERROR_INVALID_VALUE;
        *pi = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    ENTER();
    (void)v;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS && ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX))
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc;
}

EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c)
{
    ENTER();
    (void)c;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static int max_blocks_per_sm(int threads)
{
    if (threads <= 0)
        return 0;
    int b = 2048 / threads;
    return b > 32 ? 32 : b;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs, size_t shm)
{
    ENTER();
    if (!n || bs <= 0 || bs > 1024 || shm > 49152)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        *n = max_blocks_per_sm(bs);
    return rc;
}

/* ------------------------------------------------------------- device memory */

/* Map, charge and record one allocation in the current context. Caller holds g_mu. */
static CUresult dev_alloc(CUdeviceptr *out, size_t bytes, enum alloc_kind kind, CUmemoryPool pool, uint64_t charge_bytes)
{
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (charge_bytes && (rc = charge(c->dev, charge_bytes)) != CUDA_SUCCESS)
        return rc;
    void *p = map_bytes(bytes, PROT_READ | PROT_WRITE);
    struct alloc *a = p ? alloc_add() : NULL;
    if (!a) {
        if (p)
            munmap(p, bytes);
        uncharge(c->dev, charge_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    alloc_set(a, (uintptr_t)p, bytes, charge_bytes, kind, c->dev, c);
    a->pool = pool;
    *out = (CUdeviceptr)a->ptr;
    return CUDA_SUCCESS;
}

static void dev_release(struct alloc *a)
{
    munmap((void *)a->ptr, a->size ? a->size : 1);
    uncharge(a->dev, a->charged);
    alloc_remove(a);
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    ENTER();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, bytes, A_DEVICE, NULL, bytes);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
    ENTER();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, p * height, A_PITCH, NULL, p * height);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    ENTER();
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, bytes, A_MANAGED, NULL, bytes);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER();
    if (p == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *a = &g_alloc[i];
        if (a->ptr == (uintptr_t)p && (a->kind == A_DEVICE || a->kind == A_PITCH || a->kind == A_MANAGED)) {
            /* cuMemFree synchronises with work queued on the device. */
            uint64_t until = a->ctx->last_end;
            dev_release(a);
            pthread_mutex_unlock(&g_mu);
            sim_sleep_until(until);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ENTER();
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_dev *d = dev_of(c);
    if (sim_lock(1) != 0)
        return CUDA_ERROR_UNKNOWN;
    uint64_t cap = sim_capacity(d->gpu, d->slot), used = sim_used_locked(d->gpu, d->slot);
    sim_unlock();
    *total_b = cap;
    *free_b = used >= cap ? 0 : cap - used;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_containing((uintptr_t)p, 0);
    CUresult rc = a && a->kind != A_HOST && a->kind != A_HOST_REG ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    if (rc == CUDA_SUCCESS) {
        if (base)
            *base = (CUdeviceptr)a->ptr;
        if (size)
            *size = a->size;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Pinned host memory: host RAM, never charged to the device. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
    ENTER();
    (void)flags;
    if (!pp || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    void *p = NULL;
    struct alloc *a = NULL;
    if (rc == CUDA_SUCCESS) {
        p = map_bytes(bytes, PROT_READ | PROT_WRITE);
        a = p ? alloc_add() : NULL;
        if (!a) {
            if (p)
                munmap(p, bytes);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (rc == CUDA_SUCCESS) {
        alloc_set(a, (uintptr_t)p, bytes, 0, A_HOST, c->dev, c);
        *pp = p;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

EXPORT CUresult cuMemFreeHost(void *p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)p, A_HOST);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (a)
        dev_release(a);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Registered host memory: page-locked in place, never charged to the device.  A range may
 * not overlap another registration; unregistering takes the address it was registered at. */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags)
{
    ENTER();
    if (!p || bytes == 0 || (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                                  CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < g_nalloc; i++) {
        const struct alloc *o = &g_alloc[i];
        if (o->kind == A_HOST_REG && (uintptr_t)p < o->ptr + o->size && o->ptr < (uintptr_t)p + bytes)
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_add() : NULL;
    if (rc == CUDA_SUCCESS && !a)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS)
        alloc_set(a, (uintptr_t)p, bytes, 0, A_HOST_REG, c->dev, c);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)p, A_HOST_REG);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (a)
        alloc_remove(a);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Copies: the destination/source device ranges must lie inside live allocations. */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, int dst_dev, int src_dev, int sync)
{
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS && ((dst_dev && !alloc_containing(dst, n)) || (src_dev && !alloc_containing(src, n))))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && n > 0 && (!dst || !src))
        rc = CUDA_ERROR_INVALID_VALUE;
    uint64_t until = rc == CUDA_SUCCESS ? c->last_end : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (sync)
        sim_sleep_until(until);
    if (n)
        memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)h, n, 1, 0, 1);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n)
{
    ENTER();
    return copy((uintptr_t)h, (uintptr_t)d, n, 0, 1, 1);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)s, n, 1, 1, 0);
}
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)s, n, 0, 0, 1);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)s, n, 0, 0, 0);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)h, n, 1, 0, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)h, (uintptr_t)d, n, 0, 1, 0);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)s, n, 1, 1, 0);
}

static CUresult memset_n(CUdeviceptr d, unsigned v, size_t n, size_t width)
{
    if (n > SIZE_MAX / width)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS && !alloc_containing((uintptr_t)d, n * width))
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned char *p = (unsigned char *)(uintptr_t)d;
    for (size_t i = 0; i < n; i++)
        memcpy(p + i * width, &v, width); /* little-endian: low bytes first */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 1);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 2);
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 4);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    ENTER();
    (void)s;
    return memset_n(d, v, n, 1);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    ENTER();
    (void)s;
    return memset_n(d, v, n, 4);
}

/* ------------------------------------------------------------- stream-ordered allocator */

static CUresult pool_new(int dev, int is_default, CUmemoryPool *out)
{
    CUmemoryPool p = calloc(1, sizeof *p);
    if (!p || reg_add(&r_pool, p) != 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->magic = MAGIC_POOL;
    p->dev = dev;
    p->is_default = is_default;
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult default_pool(int dev, CUmemoryPool *out)
{
    struct sim_dev *d = &g_dev[dev];
    if (!d->default_pool) {
        CUresult rc = pool_new(dev, 1, &d->default_pool);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (!d->current_pool)
        d->current_pool = d->default_pool;
    *out = d->default_pool;
    return CUDA_SUCCESS;
}

/* Give reserved-but-unused pool memory back to the device, down to `keep` bytes. */
static void pool_trim(CUmemoryPool p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    if (p->reserved > floor) {
        uncharge(p->dev, p->reserved - floor);
        p->reserved = floor;
    }
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS && !pool) {
        rc = default_pool(st->ctx->dev, &pool);
        pool = g_dev[st->ctx->dev].current_pool;
    }
    if (rc == CUDA_SUCCESS && !reg_has(&r_pool, pool))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && pool->dev != st->ctx->dev)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        /* Reuse what the pool holds; grow the reservation (charged) for the rest. */
        uint64_t spare = pool->reserved - pool->used;
        uint64_t grow = bytes > spare ? bytes - spare : 0;
        if (grow && (rc = charge(pool->dev, grow)) == CUDA_SUCCESS)
            pool->reserved += grow;
        if (rc == CUDA_SUCCESS) {
            void *p = map_bytes(bytes, PROT_READ | PROT_WRITE);
            struct alloc *a = p ? alloc_add() : NULL;
            if (!a) {
                if (p)
                    munmap(p, bytes);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                alloc_set(a, (uintptr_t)p, bytes, 0, A_ASYNC, pool->dev, st->ctx);
                a->pool = pool;
                pool->used += bytes;
                if (pool->used > pool->used_high)
                    pool->used_high = pool->used;
                if (pool->reserved > pool->reserved_high)
                    pool->reserved_high = pool->reserved;
                *dptr = (CUdeviceptr)a->ptr;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    ENTER();
    return alloc_from_pool(dptr, bytes, NULL, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_from_pool(dptr, bytes, pool, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_find((uintptr_t)p, A_ASYNC) : NULL;
    if (rc == CUDA_SUCCESS && !a)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUmemoryPool pool = a->pool;
        pool->used -= a->size; /* stays reserved in the pool until trimmed */
        munmap((void *)a->ptr, a->size);
        alloc_remove(a);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    ENTER();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = pool_new(props->location.id, 0, pool);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) && !pool->is_default ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        /* Live allocations keep their memory until freed; the reservation goes now. */
        for (size_t i = 0; i < g_nalloc; i++)
            if (g_alloc[i].pool == pool)
                g_alloc[i].pool = NULL;
        uncharge(pool->dev, pool->reserved);
        if (g_dev[pool->dev].current_pool == pool)
            g_dev[pool->dev].current_pool = g_dev[pool->dev].default_pool;
        reg_del(&r_pool, pool);
        pool->magic = 0;
        free(pool);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        pool_trim(pool, keep);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = *(cuuint64_t *)value; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            if (*(cuuint64_t *)value != 0)
                rc = CUDA_ERROR_INVALID_VALUE;
            else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
                pool->reserved_high = pool->reserved;
            else
                pool->used_high = pool->used;
            break;
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: break;
        default: rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = 1; break;
        default: rc = CUDA_ERROR_INVALID_VALUE;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = default_pool(d, pool);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUmemoryPool p = NULL;
    CUresult rc = default_pool(d, &p);
    if (rc == CUDA_SUCCESS)
        *pool = g_dev[d].current_pool;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) && pool->dev == d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUmemoryPool p = NULL;
        rc = default_pool(d, &p);
        g_dev[d].current_pool = pool;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ------------------------------------------------------------- virtual memory management */

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o)
{
    ENTER();
    (void)o;
    if (!g || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER();
    if (!h || !prop || flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    /* Physical memory belongs to the process, not to a context: no current context needed,
     * as with the real driver. */
    pthread_mutex_lock(&g_mu);
    CUresult rc = charge(prop->location.id, size);
    if (rc == CUDA_SUCCESS) {
        struct alloc *a = alloc_add();
        if (!a) {
            uncharge(prop->location.id, size);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            a->ptr = g_next_handle;
            g_next_handle += 0x10;
            a->size = size;
            a->charged = size;
            a->kind = A_VMM_HANDLE;
            a->dev = prop->location.id;
            a->ctx = NULL; /* physical handles outlive contexts until released */
            *h = (CUmemGenericAllocationHandle)a->ptr;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)h, A_VMM_HANDLE);
    CUresult rc = a && !a->released ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        if (a->maps > 0) {
            a->released = 1; /* memory is freed when the last mapping goes */
        } else {
            uncharge(a->dev, a->charged);
            alloc_remove(a);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    ENTER();
    (void)addr;
    if (!ptr || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 || (align & (align - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t al = align > VMM_GRANULARITY ? align : VMM_GRANULARITY;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    void *raw = map_bytes(size + al, PROT_NONE);
    struct alloc *a = raw ? alloc_add() : NULL;
    if (!a) {
        if (raw)
            munmap(raw, size + al);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uintptr_t p = ((uintptr_t)raw + al - 1) & ~(uintptr_t)(al - 1);
        if (p > (uintptr_t)raw)
            munmap(raw, p - (uintptr_t)raw);
        uintptr_t tail = p + size, rend = (uintptr_t)raw + size + al;
        if (rend > tail)
            munmap((void *)tail, rend - tail);
        a->ptr = p;
        a->size = size;
        a->kind = A_VA_RANGE;
        a->dev = -1;
        *ptr = (CUdeviceptr)p;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr, A_VA_RANGE);
    CUresult rc = a && a->size == size && a->maps == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        munmap((void *)a->ptr, a->size);
        alloc_remove(a);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* A mapping is recorded as its own entry (kind A_VA_RANGE with dev >= 0). */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags)
{
    ENTER();
    if (flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 || offset != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct alloc *ha = alloc_find((uintptr_t)h, A_VMM_HANDLE);
    struct alloc *range = NULL;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *r = &g_alloc[i];
        if (r->kind == A_VA_RANGE && r->dev < 0 && (uintptr_t)ptr >= r->ptr && (uintptr_t)ptr - r->ptr <= r->size &&
            size <= r->size - ((uintptr_t)ptr - r->ptr))
            range = r;
    }
    CUresult rc = ha && !ha->released && range && size <= ha->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && (uintptr_t)ptr < m->ptr + m->size && m->ptr < (uintptr_t)ptr + size)
            rc = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    }
    if (rc == CUDA_SUCCESS) {
        struct alloc *m = alloc_add();
        if (!m) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            ha = alloc_find((uintptr_t)h, A_VMM_HANDLE); /* alloc_add may have moved it */
            for (size_t i = 0; i < g_nalloc; i++)
                if (g_alloc[i].kind == A_VA_RANGE && g_alloc[i].dev < 0 && (uintptr_t)ptr >= g_alloc[i].ptr &&
                    (uintptr_t)ptr < g_alloc[i].ptr + g_alloc[i].size)
                    g_alloc[i].maps++;
            m->ptr = (uintptr_t)ptr;
            m->size = size;
            m->kind = A_VA_RANGE;
            m->dev = ha->dev;
            m->handle = (uintptr_t)h;
            ha->maps++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    ENTER();
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && m->ptr == (uintptr_t)ptr && m->size == size)
            rc = CUDA_SUCCESS;
    }
    for (size_t i = 0; rc == CUDA_SUCCESS && i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 || desc[i].location.id >= g_ndev)
            rc = CUDA_ERROR_INVALID_DEVICE;
    if (rc == CUDA_SUCCESS) {
        int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ   ? PROT_READ
                                                                      : PROT_NONE;
        if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
            rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && m->ptr == (uintptr_t)ptr && m->size == size) {
            uintptr_t h = m->handle;
            mprotect((void *)m->ptr, m->size, PROT_NONE);
            madvise((void *)m->ptr, m->size, MADV_DONTNEED);
            alloc_remove(m);
            for (size_t j = 0; j < g_nalloc; j++)
                if (g_alloc[j].kind == A_VA_RANGE && g_alloc[j].dev < 0 && (uintptr_t)ptr >= g_alloc[j].ptr &&
                    (uintptr_t)ptr < g_alloc[j].ptr + g_alloc[j].size && g_alloc[j].maps > 0)
                    g_alloc[j].maps--;
            struct alloc *ha = alloc_find(h, A_VMM_HANDLE);
            if (ha && --ha->maps == 0 && ha->released) {
                uncharge(ha->dev, ha->charged);
                alloc_remove(ha);
            }
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ------------------------------------------------------------- arrays */

static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

struct CUarray_st {
    uint32_t magic;
    CUDA_ARRAY3D_DESCRIPTOR desc;
};

struct CUmipmappedArray_st {
    uint32_t magic;
    unsigned levels;
    struct CUarray_st level[32]; /* what cuMipmappedArrayGetLevel hands out; owned here */
};

/* The descriptor of mip level `l` of d: every extent halves, down to 1 (0 stays 0). */
static CUDA_ARRAY3D_DESCRIPTOR mip_level(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned l)
{
    CUDA_ARRAY3D_DESCRIPTOR o = *d;
    o.Width = d->Width >> l ? d->Width >> l : 1;
    o.Height = d->Height ? (d->Height >> l ? d->Height >> l : 1) : 0;
    o.Depth = d->Depth ? (d->Depth >> l ? d->Depth >> l : 1) : 0;
    return o;
}

/* Device bytes of an array with `levels` mip levels (rows padded to 512 bytes). */
static CUresult array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels, size_t *out)
{
    size_t eb = format_bytes(d->Format);
    if (eb == 0 || d->Width == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        CUDA_ARRAY3D_DESCRIPTOR m = mip_level(d, l);
        size_t h = m.Height ? m.Height : 1, depth = m.Depth ? m.Depth : 1;
        if (m.Width > SIZE_MAX / 64)
            return CUDA_ERROR_OUT_OF_MEMORY;
        size_t row = (m.Width * eb * m.NumChannels + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
        if (h > SIZE_MAX / row || depth > SIZE_MAX / (row * h) || total > SIZE_MAX - row * h * depth)
            return CUDA_ERROR_OUT_OF_MEMORY;
        total += row * h * depth;
    }
    *out = total;
    return CUDA_SUCCESS;
}

/* An array object (heap memory, freed with it) of `bytes` device memory: charged to the current
 * context's device and recorded as an allocation of `kind`; freed on failure. */
static CUresult array_record(void *obj, size_t bytes, enum alloc_kind kind)
{
    if (!obj)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = charge(c->dev, bytes);
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_add() : NULL;
    if (rc == CUDA_SUCCESS && !a) {
        uncharge(c->dev, bytes);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (a)
        alloc_set(a, (uintptr_t)obj, bytes, bytes, kind, c->dev, c);
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        free(obj);
    return rc;
}

static CUresult array_destroy(void *obj, enum alloc_kind kind)
{
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)obj, kind);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (a) {
        uncharge(a->dev, a->charged);
        alloc_remove(a);
        free(obj);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult array_create(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    size_t bytes = 0;
    if (!pa)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = array_bytes(d, 1, &bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUarray_st *arr = calloc(1, sizeof *arr);
    if (arr) {
        arr->magic = 0x41525231u;
        arr->desc = *d;
    }
    rc = array_record(arr, bytes, A_ARRAY);
    if (rc == CUDA_SUCCESS)
        *pa = arr;
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pa, const CUDA_ARRAY_DESCRIPTOR *d)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Depth = 0, .Format = d->Format, .NumChannels = d->NumChannels, .Flags = 0};
    return array_create(pa, &d3);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(pa, d);
}

/* A live array: one of ours, or a level of a live mipmapped array.  Caller holds g_mu. */
static int array_live(CUarray arr)
{
    if (alloc_find((uintptr_t)arr, A_ARRAY))
        return 1;
    for (size_t i = 0; i < g_nalloc; i++) {
        const struct CUmipmappedArray_st *m = (const void *)g_alloc[i].ptr;
        if (g_alloc[i].kind == A_MIPMAP && arr >= &m->level[0] && arr < &m->level[m->levels])
            return 1;
    }
    return 0;
}

EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *out, CUarray arr)
{
    ENTER();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = array_live(arr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        out->Width = arr->desc.Width;
        out->Height = arr->desc.Height;
        out->Format = arr->desc.Format;
        out->NumChannels = arr->desc.NumChannels;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    ENTER();
    return array_destroy(arr, A_ARRAY);
}

/* Mipmapped arrays: every level is charged at creation; the levels belong to the array. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pm, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    ENTER();
    if (!pm || !d || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t longest = d->Width > d->Height ? d->Width : d->Height;
    longest = longest > d->Depth ? longest : d->Depth;
    unsigned max_levels = 1;
    while (max_levels < 32 && (longest >> max_levels))
        max_levels++;
    if (levels > max_levels)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    CUresult rc = array_bytes(d, levels, &bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUmipmappedArray_st *m = calloc(1, sizeof *m);
    if (m) {
        m->magic = 0x4d495031u;
        m->levels = levels;
        for (unsigned l = 0; l < levels; l++) {
            m->level[l].magic = 0x41525231u;
            m->level[l].desc = mip_level(d, l);
        }
    }
    rc = array_record(m, bytes, A_MIPMAP);
    if (rc == CUDA_SUCCESS)
        *pm = m;
    return rc;
}

EXPORT CUresult cuMipmappedArrayGetLevel(CUarray *pa, CUmipmappedArray m, unsigned int level)
{
    ENTER();
    if (!pa)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = alloc_find((uintptr_t)m, A_MIPMAP) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && level >= m->levels)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *pa = &m->level[level];
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    ENTER();
    return array_destroy(m, A_MIPMAP);
}

/* Destroying a context frees everything allocated in it, as the driver does. */
static void free_ctx_resources(CUcontext c)
{
    for (size_t i = 0; i < g_nalloc;) {
        struct alloc *a = &g_alloc[i];
        if (a->ctx != c) {
            i++;
            continue;
        }
        if (a->kind == A_ARRAY || a->kind == A_MIPMAP) {
            uncharge(a->dev, a->charged);
            free((void *)a->ptr);
            alloc_remove(a);
        } else if (a->kind == A_HOST_REG) {
            alloc_remove(a); /* unregistered; the memory is the caller's */
        } else {
            if (a->kind == A_ASYNC && a->pool)
                a->pool->used -= a->size;
            dev_release(a);
        }
    }
    for (size_t i = 0; i < r_pool.n; i++) {
        CUmemoryPool p = r_pool.items[i];
        if (p->dev == c->dev && p->is_default)
            pool_trim(p, 0);
    }
    for (size_t i = 0; i < r_mod.n;) {
        CUmodule m = r_mod.items[i];
        if (m->ctx == c)
            module_free(m);
        else
            i++;
    }
    for (size_t i = 0; i < r_stream.n;) {
        CUstream s = r_stream.items[i];
        if (s->ctx == c && s != c->null_stream)
            stream_free(s);
        else
            i++;
    }
    for (size_t i = 0; i < r_event.n;) {
        CUevent e = r_event.items[i];
        if (e->ctx == c) {
            reg_del(&r_event, e);
            free(e);
        } else {
            i++;
        }
    }
    c->null_stream->last_end = 0;
    c->null_stream->ring_count = 0;
}

/* ------------------------------------------------------------- launches: the kernel time model */

struct launch {
    CUfunction f;
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    uint64_t cost_value;   /* value of the cost parameter, when the kernel has one */
    int has_cost_value;
};

static CUresult launch_validate(const struct launch *l, int cooperative, int dev)
{
    if (!reg_has(&r_func, l->f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (l->gx == 0 || l->gy == 0 || l->gz == 0 || l->bx == 0 || l->by == 0 || l->bz == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (l->gy > 65535 || l->gz > 65535 || l->bx > 1024 || l->by > 1024 || l->bz > 64)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = (uint64_t)l->bx * l->by * l->bz;
    if (threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (l->shmem > 232448)
        return CUDA_ERROR_INVALID_VALUE;
    if (cooperative) {
        uint64_t blocks = (uint64_t)l->gx * l->gy * l->gz;
        if (blocks > (uint64_t)g_dev[dev].sm * (uint64_t)max_blocks_per_sm((int)threads))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    return CUDA_SUCCESS;
}

/* Cost = blocks x ns per block (+ fixed).  The device (or MIG instance) runs one kernel at a
 * time, first come first served across all processes of the node; the launch returns at
 * once unless the stream already has launch_queue_depth kernels pending, in which case it
 * blocks until the oldest finishes, as a full push buffer does. */
static CUresult launch_do(struct launch *l, int cooperative)
{
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(l->stream, &st);
    if (rc == CUDA_SUCCESS)
        rc = launch_validate(l, cooperative, st->ctx->dev);
    if (rc == CUDA_SUCCESS && l->f->mod->ctx != st->ctx)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_mu);
        return rc;
    }
    const struct sim_kernel *k = &l->f->k;
    uint64_t per_block = k->cost_param >= 0 && l->has_cost_value ? l->cost_value : k->ns_per_block;
    uint64_t blocks = (uint64_t)l->gx * l->gy * l->gz;
    uint64_t cost = blocks * per_block + k->fixed_ns;
    /* Bounded launch queue. */
    uint64_t wait_until = 0;
    uint64_t now = sim_now_ns();
    while (st->ring_count > 0 && st->ring[(st->ring_head + st->ring_cap - st->ring_count) % st->ring_cap] <= now)
        st->ring_count--;
    if (st->ring_count == st->ring_cap) {
        wait_until = st->ring[(st->ring_head + st->ring_cap - st->ring_count) % st->ring_cap];
        st->ring_count--;
    }
    pthread_mutex_unlock(&g_mu);
    if (wait_until) {
        sim_sleep_until(wait_until);
        now = sim_now_ns();
    }
    pthread_mutex_lock(&g_mu);
    if (!stream_ok(st) || !ctx_usable(st->ctx)) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct sim_dev *d = dev_of(st->ctx);
    if (sim_lock(0) != 0) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_UNKNOWN;
    }
    uint64_t end = sim_timeline_submit_locked(d->gpu, d->slot, cost, now);
    sim_unlock();
    st->ring[st->ring_head] = end;
    st->ring_head = (st->ring_head + 1) % st->ring_cap;
    st->ring_count++;
    if (end > st->last_end)
        st->last_end = end;
    if (end > st->ctx->last_end)
        st->ctx->last_end = end;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static CUresult launch_common(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shmem, CUstream s, void **params, void **extra, int coop)
{
    struct launch l = {f, gx, gy, gz, bx, by, bz, shmem, s, 0, 0};
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    int ok = reg_has(&r_func, f);
    int cp = ok ? f->k.cost_param : -1;
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cp >= 0) {
        if (!params || !params[cp])
            return CUDA_ERROR_INVALID_VALUE;
        memcpy(&l.cost_value, params[cp], sizeof l.cost_value);
        l.has_cost_value = 1;
    }
    return launch_do(&l, coop);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    ENTER();
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra, 0);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)
{
    ENTER();
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL, 1);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    ENTER();
    if (!cfg || (cfg->numAttrs > 0 && !cfg->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    int coop = 0;
    for (unsigned i = 0; i < cfg->numAttrs; i++)
        if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && cfg->attrs[i].value.cooperative)
            coop = 1;
    return launch_common(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                         cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params, extra, coop);
}

/* ------------------------------------------------------------- graphs (kernel nodes) */

struct CUgraphNode_st {
    uint32_t magic;
    CUgraph graph;
    struct launch l;
};

struct CUgraph_st {
    uint32_t magic;
    CUgraphNode *nodes;
    size_t n;
};

struct CUgraphExec_st {
    uint32_t magic;
    struct launch *l;
    size_t n;
};

EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
    ENTER();
    if (!pg || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUgraph g = calloc(1, sizeof *g);
    CUresult rc = g && reg_add(&r_graph, g) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        g->magic = MAGIC_GRAPH;
        *pg = g;
    } else {
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        for (size_t i = 0; i < g->n; i++) {
            reg_del(&r_node, g->nodes[i]);
            free(g->nodes[i]);
        }
        free(g->nodes);
        reg_del(&r_graph, g);
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult add_kernel_node(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUfunction f,
                                unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned shmem, void **params, void **extra)
{
    if (!pn || (ndeps && !deps) || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < ndeps; i++)
        if (!reg_has(&r_node, deps[i]) || deps[i]->graph != g)
            rc = CUDA_ERROR_INVALID_VALUE;
    struct launch l = {f, gx, gy, gz, bx, by, bz, shmem, NULL, 0, 0};
    if (rc == CUDA_SUCCESS && !reg_has(&r_func, f))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && f->k.cost_param >= 0) {
        /* Like the real graph, node parameters are copied at creation. */
        if (!params || !params[f->k.cost_param])
            rc = CUDA_ERROR_INVALID_VALUE;
        else {
            memcpy(&l.cost_value, params[f->k.cost_param], sizeof l.cost_value);
            l.has_cost_value = 1;
        }
    }
    if (rc == CUDA_SUCCESS) {
        CUgraphNode n = calloc(1, sizeof *n);
        CUgraphNode *nn = n ? realloc(g->nodes, (g->n + 1) * sizeof *nn) : NULL;
        if (!nn || reg_add(&r_node, n) != 0) {
            if (nn)
                g->nodes = nn;
            free(n);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            g->nodes = nn;
            n->magic = MAGIC_NODE;
            n->graph = g;
            n->l = l;
            g->nodes[g->n++] = n;
            *pn = n;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                        const CUDA_KERNEL_NODE_PARAMS *p)
{
    ENTER();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(pn, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

CUresult sim_cuGraphAddKernelNode_v1(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS_v1 *p) __asm__("cuGraphAddKernelNode");
EXPORT CUresult sim_cuGraphAddKernelNode_v1(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                            const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    ENTER();
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    return add_kernel_node(pn, g, deps, ndeps, p->func, p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
                           p->blockDimY, p->blockDimZ, p->sharedMemBytes, p->kernelParams, p->extra);
}

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    ENTER();
    (void)flags;
    if (!pe)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_graph, g) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUgraphExec e = calloc(1, sizeof *e);
        struct launch *l = calloc(g->n ? g->n : 1, sizeof *l);
        if (!e || !l || reg_add(&r_gexec, e) != 0) {
            free(e);
            free(l);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            /* Nodes were added after their dependencies: insertion order is topological. */
            for (size_t i = 0; i < g->n; i++)
                l[i] = g->nodes[i]->l;
            e->magic = MAGIC_GEXEC;
            e->l = l;
            e->n = g->n;
            *pe = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

CUresult sim_cuGraphInstantiate_legacy(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
    __asm__("cuGraphInstantiate_v2");
EXPORT CUresult sim_cuGraphInstantiate_legacy(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    if (err)
        *err = NULL;
    if (log && n)
        log[0] = '\0';
    return cuGraphInstantiateWithFlags(pe, g, 0);
}

CUresult sim_cuGraphInstantiate_v1(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
    __asm__("cuGraphInstantiate");
EXPORT CUresult sim_cuGraphInstantiate_v1(CUgraphExec *pe, CUgraph g, CUgraphNode *err, char *log, size_t n)
{
    return sim_cuGraphInstantiate_legacy(pe, g, err, log, n);
}

EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    int ok = reg_has(&r_gexec, e);
    size_t n = ok ? e->n : 0;
    struct launch *copy_l = ok ? calloc(n ? n : 1, sizeof *copy_l) : NULL;
    if (copy_l)
        memcpy(copy_l, e->l, n * sizeof *copy_l);
    pthread_mutex_unlock(&g_mu);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    if (!copy_l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    for (size_t i = 0; i < n && rc == CUDA_SUCCESS; i++) {
        copy_l[i].stream = s;
        rc = launch_do(&copy_l[i], 0);
    }
    free(copy_l);
    return rc;
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_gexec, e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        reg_del(&r_gexec, e);
        free(e->l);
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* ------------------------------------------------------------- export table, proc address */

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    (void)id;
    if (table)
        *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED; /* the runtime's private tables are out of reach */
}

/* Simulator control, for tests: make the next `count` calls of `fn` (in every process of
 * the node) fail with `code` after `delay_us`.  count -1: every call; code 0: delay only. */
EXPORT int tesseraSimSetFault(const char *fn, int count, int code, unsigned delay_us)
{
    if (sim_attach() != 0)
        return -1;
    return sim_fault_set(fn, count, code, delay_us);
}

CUresult sim_cuGetProcAddress_v1(const char *sym, void **pfn, int ver, cuuint64_t flags) __asm__("cuGetProcAddress");

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
