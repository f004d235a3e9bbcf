/* libtessera: the driver's own entry points, resolved once per library: every name of
 * hooks.def (REAL) and the entry points the library calls without hooking them (drv). */
#include "driver.h"

#include "glibc.h"

void *real_ptr[IDX_COUNT];
struct driver_calls drv;
pthread_once_t cu_once = PTHREAD_ONCE_INIT, nvml_once = PTHREAD_ONCE_INIT;

/* The names inline, not pointers to them: the loader has nothing to relocate here. */
#define NAME_MAX_LEN 40
static const struct {
    char name[NAME_MAX_LEN];
    enum th_lib lib;
} hooked[IDX_COUNT] = {
#define H(lib, name, base, ver, ptsz, cls) {#name, LIB_##lib},
#include "hooks.def"
#undef H
};
#define H(lib, name, base, ver, ptsz, cls) \
    _Static_assert(sizeof #name <= NAME_MAX_LEN, #name ": name too long for driver.c");
#include "hooks.def"
#undef H

/* dlopen the library (already loaded by the caller: this finds it) and resolve its hooked
 * names.  NULL, logged, when it cannot be loaded. */
static void *open_lib(const char *file, enum th_lib lib)
{
    pthread_once(&libc_once, libc_init);
    void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        th_log("cannot load %s: %s", file, dlerror());
        return NULL;
    }
    for (int i = 0; i < IDX_COUNT; i++)
        if (hooked[i].lib == lib)
            real_ptr[i] = tessera_real_dlsym(h, hooked[i].name);
    return h;
}

#define RESOLVE(h, field, name) (drv.field = (__typeof__(drv.field))tessera_real_dlsym(h, name))

void cu_init(void)
{
    void *h = open_lib("libcuda.so.1", LIB_CU);
    if (!h)
        return;
    RESOLVE(h, cuCtxGetDevice, "cuCtxGetDevice");
    RESOLVE(h, cuDeviceGetCount, "cuDeviceGetCount");
    if (!RESOLVE(h, cuDeviceGetUuid, "cuDeviceGetUuid_v2"))
        RESOLVE(h, cuDeviceGetUuid, "cuDeviceGetUuid");
    RESOLVE(h, cuGraphGetNodes, "cuGraphGetNodes");
    RESOLVE(h, cuGraphNodeGetType, "cuGraphNodeGetType");
    RESOLVE(h, cuGraphChildGraphNodeGetGraph, "cuGraphChildGraphNodeGetGraph");
    RESOLVE(h, cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
    RESOLVE(h, cuDeviceGetMemPool, "cuDeviceGetMemPool");
    RESOLVE(h, cuMemPoolGetAttribute, "cuMemPoolGetAttribute");
}

void nvml_init(void)
{
    void *h = open_lib("libnvidia-ml.so.1", LIB_NVML);
    if (h) {
        RESOLVE(h, nvmlDeviceGetUUID, "nvmlDeviceGetUUID");
        RESOLVE(h, nvmlDeviceGetIndex, "nvmlDeviceGetIndex");
    }
}
