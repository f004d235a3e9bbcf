/* Fake libcuda.so.1: cuGetExportTable, the driver's private tables the CUDA runtime
 * (libcudart) asks for before its first call.  Their layouts are not published; what is
 * here is what the runtime of the pinned nvidia-cuda-runtime-cu12 wheel asks for and calls,
 * as public reimplementations of the driver document it (docs: sim/README.md, "The CUDA
 * runtime on the simulator").  Every table is an array of pointer-sized slots; most start
 * with their own size in bytes.
 *
 *   cudart interface   modules from the fatbins a program registers, the primary context
 *   tools hooks        profiler callbacks (none here: no-ops) and two scratch buffers
 *   tools TLS          a per-thread callback (no-op)
 *   context storage    per (context, key) values the runtime keeps its state in
 *   context checks     "is this context usable" (always)
 *   integrity check    an HMAC-MD2 over the process, the tables and the devices, which the
 *                      runtime computes too and compares before it trusts the driver
 *
 * The "skip the runtime's own start-up" probe is answered CUDA_ERROR_NOT_FOUND, as a driver
 * without that table answers (NOT_SUPPORTED makes the runtime give up); any other table is
 * CUDA_ERROR_NOT_SUPPORTED. */
#include "cuda_core.h"

#include "fatbin.h"
#include "md2.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

typedef unsigned char uuid16[16];

static const uuid16 ID_CUDART = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
static const uuid16 ID_TOOLS_HOOKS = {0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74,
                                      0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66};
static const uuid16 ID_TOOLS_TLS = {0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47,
                                    0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc};
static const uuid16 ID_CTX_STORAGE = {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11,
                                      0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93};
static const uuid16 ID_CTX_CHECKS = {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43,
                                     0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e};
static const uuid16 ID_INTEGRITY = {0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b,
                                    0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2};
static const uuid16 ID_SKIP_INIT = {0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e,
                                    0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9};

/* ---- cudart interface ---------------------------------------------------------------- */

struct fatbinc_wrapper {
    int magic;
    int version;
    const unsigned long long *data; /* the fatbin (0xBA55ED50 header) */
    void *filename_or_fatbins;
};

static CUresult module_from_wrapper(CUmodule *m, const struct fatbinc_wrapper *w)
{
    if (!m || !w)
        return CUDA_ERROR_INVALID_VALUE;
    if ((unsigned)w->magic != FATBINC_MAGIC || !w->data)
        return CUDA_ERROR_INVALID_IMAGE;
    return cuModuleLoadData(m, w->data);
}

static CUresult rt_module(CUmodule *m, const struct fatbinc_wrapper *w)
{
    return module_from_wrapper(m, w);
}

static CUresult rt_module_ext1(CUmodule *m, const struct fatbinc_wrapper *w, void *a, void *b, unsigned c)
{
    (void)a, (void)b, (void)c;
    return module_from_wrapper(m, w);
}

static CUresult rt_module_ext2(const void *fatbin, CUmodule *m, void *a, void *b, unsigned c)
{
    (void)a, (void)b, (void)c;
    if (!m || !fatbin)
        return CUDA_ERROR_INVALID_VALUE;
    return cuModuleLoadData(m, fatbin);
}

static CUresult rt_primary_context(CUcontext *c, CUdevice d)
{
    return cuDevicePrimaryCtxRetain(c, d);
}

static void rt_noop(uintptr_t a)
{
    (void)a;
}

static CUresult rt_load_compilers(void)
{
    return CUDA_SUCCESS;
}

static const void *const cudart_table[13] = {
    (const void *)(uintptr_t)sizeof(void *[13]),
    (const void *)rt_module,
    (const void *)rt_primary_context,
    NULL, NULL, NULL,
    (const void *)rt_module_ext1,
    (const void *)rt_noop,
    (const void *)rt_module_ext2,
    NULL, NULL, NULL,
    (const void *)rt_load_compilers,
};

/* ---- tools hooks and TLS: no profiler is attached to a simulated node ------------------ */

static void tools_event(unsigned event, void *data)
{
    (void)event, (void)data;
}

static void tools_span(void *a, void *b)
{
    (void)a, (void)b;
}

static unsigned char tools_buf1[1024], tools_buf2[16];

static void tools_buffer1(void **p, size_t *n)
{
    if (p)
        *p = tools_buf1;
    if (n)
        *n = sizeof tools_buf1;
}

static void tools_buffer2(void **p, size_t *n)
{
    if (p)
        *p = tools_buf2;
    if (n)
        *n = 14; /* what the runtime expects of this one */
}

static const void *const tools_hooks_table[7] = {
    (const void *)(uintptr_t)sizeof(void *[7]),
    (const void *)tools_event,
    (const void *)tools_buffer1,
    NULL,
    (const void *)tools_span,
    NULL,
    (const void *)tools_buffer2,
};

static void tools_tls_callback(void *record)
{
    (void)record;
}

static const void *const tools_tls_table[4] = {
    (const void *)(uintptr_t)sizeof(void *[4]),
    NULL,
    (const void *)tools_tls_callback,
    NULL,
};

/* ---- context-local storage ------------------------------------------------------------ */

#define CTX_STORAGE_MAX 256

static struct ctx_value {
    CUcontext ctx;
    void *key;
    void *value;
} ctx_values[CTX_STORAGE_MAX];
static pthread_mutex_t ctx_values_mu = PTHREAD_MUTEX_INITIALIZER;

static CUresult storage_ctx(CUcontext *c)
{
    if (*c)
        return CUDA_SUCCESS;
    CUresult rc = cuCtxGetCurrent(c);
    if (rc == CUDA_SUCCESS && !*c)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    return rc;
}

static struct ctx_value *storage_find(CUcontext c, void *key)
{
    for (int i = 0; i < CTX_STORAGE_MAX; i++)
        if (ctx_values[i].ctx == c && ctx_values[i].key == key)
            return &ctx_values[i];
    return NULL;
}

static CUresult storage_put(CUcontext c, void *key, void *value, void *dtor)
{
    (void)dtor; /* never called: a destroyed context's values are dropped (sim_ctx_storage_drop) */
    CUresult rc = storage_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ctx_values_mu);
    struct ctx_value *v = storage_find(c, key);
    if (!v)
        v = storage_find(NULL, NULL);
    if (v)
        *v = (struct ctx_value){c, key, value};
    pthread_mutex_unlock(&ctx_values_mu);
    return v ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult storage_delete(CUcontext c, void *key)
{
    CUresult rc = storage_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ctx_values_mu);
    struct ctx_value *v = storage_find(c, key);
    if (v)
        *v = (struct ctx_value){0};
    pthread_mutex_unlock(&ctx_values_mu);
    return CUDA_SUCCESS;
}

static CUresult storage_get(void **value, CUcontext c, void *key)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    *value = NULL;
    CUresult rc = storage_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&ctx_values_mu);
    struct ctx_value *v = storage_find(c, key);
    if (v)
        *value = v->value;
    pthread_mutex_unlock(&ctx_values_mu);
    return v ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

void sim_ctx_storage_drop(CUcontext c)
{
    pthread_mutex_lock(&ctx_values_mu);
    for (int i = 0; i < CTX_STORAGE_MAX; i++)
        if (ctx_values[i].ctx == c)
            ctx_values[i] = (struct ctx_value){0};
    pthread_mutex_unlock(&ctx_values_mu);
}

static const void *const ctx_storage_table[4] = {
    (const void *)storage_put,
    (const void *)storage_delete,
    (const void *)storage_get,
    NULL,
};

/* ---- context checks ------------------------------------------------------------------- */

static CUresult ctx_check(CUcontext c, unsigned *result, const void **detail)
{
    (void)c, (void)detail;
    if (result)
        *result = 0;
    return CUDA_SUCCESS;
}

static unsigned ctx_check_flags(void)
{
    return 0;
}

static const void *const ctx_checks_table[4] = {
    (const void *)(uintptr_t)sizeof(void *[4]),
    NULL,
    (const void *)ctx_check,
    (const void *)ctx_check_flags,
};

/* ---- integrity check ------------------------------------------------------------------
 * HMAC-MD2 keyed with a constant, over (driver version, the runtime's version, process id,
 * thread id, where the cudart and integrity tables and the check itself are, the runtime's
 * clock) and then (UUID, PCI domain, bus, device) of each device CUDA enumerates.  Runtime
 * versions ending in 0 or 1 are answered with fixed values. */

static const uint8_t INTEGRITY_KEY[16] = {0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52,
                                          0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f};

struct integrity_process {
    uint32_t driver_version, runtime_version, pid, thread;
    const void *cudart_table, *integrity_table, *check;
    uint64_t unix_seconds;
};

struct integrity_device {
    CUuuid uuid;
    int32_t pci_domain, pci_bus, pci_device;
};

_Static_assert(sizeof(struct integrity_process) == 48, "hashed as laid out in memory");
_Static_assert(sizeof(struct integrity_device) == 28, "hashed as laid out in memory");

static const void *const integrity_table[3];

static CUresult integrity_check(unsigned version, uint64_t unix_seconds, uint64_t result[2])
{
    if (!result)
        return CUDA_ERROR_INVALID_VALUE;
    if (version % 10 < 2) {
        result[0] = version % 10 == 0 ? 0x3341181C03CB675Cull : 0x1841181C03CB675Cull;
        result[1] = 0x8ED383AA1F4CD1E8ull;
        return CUDA_SUCCESS;
    }
    int driver = 0, n = 0;
    CUresult rc = cuDriverGetVersion(&driver);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGetCount(&n);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct integrity_process proc = {
        .driver_version = (uint32_t)driver,
        .runtime_version = version,
        .pid = (uint32_t)getpid(),
        .thread = (uint32_t)pthread_self(),
        .cudart_table = cudart_table,
        .integrity_table = integrity_table,
        .check = (const void *)integrity_check,
        .unix_seconds = unix_seconds,
    };
    struct integrity_device devs[SIM_MAX_DEVS];
    for (int d = 0; d < n && d < SIM_MAX_DEVS; d++) {
        rc = cuDeviceGetUuid(&devs[d].uuid, d);
        if (rc == CUDA_SUCCESS)
            rc = cuDeviceGetAttribute(&devs[d].pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d);
        if (rc == CUDA_SUCCESS)
            rc = cuDeviceGetAttribute(&devs[d].pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d);
        if (rc == CUDA_SUCCESS)
            rc = cuDeviceGetAttribute(&devs[d].pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    const void *parts[] = {&proc, devs};
    size_t sizes[] = {sizeof proc, (size_t)n * sizeof devs[0]};
    uint8_t digest[16];
    hmac_md2(INTEGRITY_KEY, parts, sizes, 2, digest);
    memcpy(result, digest, sizeof digest);
    return CUDA_SUCCESS;
}

static const void *const integrity_table[3] = {
    (const void *)(uintptr_t)sizeof(void *[3]),
    (const void *)integrity_check,
    NULL,
};

/* ---- the lookup ----------------------------------------------------------------------- */

static const struct {
    const unsigned char *id;
    const void *const *table;
} export_tables[] = {
    {ID_CUDART, cudart_table},
    {ID_TOOLS_HOOKS, tools_hooks_table},
    {ID_TOOLS_TLS, tools_tls_table},
    {ID_CTX_STORAGE, ctx_storage_table},
    {ID_CTX_CHECKS, ctx_checks_table},
    {ID_INTEGRITY, integrity_table},
};

EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    if (!table || !id)
        return CUDA_ERROR_INVALID_VALUE;
    *table = NULL;
    for (size_t i = 0; i < sizeof export_tables / sizeof export_tables[0]; i++)
        if (memcmp(id->bytes, export_tables[i].id, 16) == 0) {
            *table = export_tables[i].table;
            return CUDA_SUCCESS;
        }
    if (memcmp(id->bytes, ID_SKIP_INIT, 16) == 0)
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_ERROR_NOT_SUPPORTED;
}
