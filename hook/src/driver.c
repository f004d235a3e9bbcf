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

/* The library's own definition of `name` when it has one, read from its symbol table (a
 * tenth of what glibc's dlsym costs, which pays for its error handling on every call); else
 * what dlsym finds (in a dependency, or not a plain function).  x: NULL when not indexed. */
static void *lookup(void *h, const struct elf_index *x, const char *name)
{
    void *p = x ? elf_find(x, name) : NULL;
    return p ? p : tessera_real_dlsym(h, name);
}

/* dlopen the library (already loaded by the caller: this finds it) and resolve its hooked
 * names.  NULL, logged, when it cannot be loaded; *x: its symbol table (NULL: none read). */
static void *open_lib(const char *file, enum th_lib lib, struct elf_index *idx,
                      const struct elf_index **x)
{
    pthread_once(&libc_once, libc_init);
    void *h = dlopen(file, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        th_log("cannot load %s: %s", file, dlerror());
        return NULL;
    }
    struct link_map *m;
    *x = dlinfo(h, RTLD_DI_LINKMAP, &m) == 0 && elf_index(m, idx) ? idx : NULL;
    for (int i = 0; i < IDX_COUNT; i++)
        if (hooked[i].lib == lib)
            real_ptr[i] = lookup(h, *x, hooked[i].name);
    return h;
}

#define RESOLVE(h, field, name) (drv.field = (__typeof__(drv.field))lookup(h, x, name))

void cu_init(void)
{
    struct elf_index idx;
    const struct elf_index *x;
    void *h = open_lib("libcuda.so.1", LIB_CU, &idx, &x);
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
    struct elf_index idx;
    const struct elf_index *x;
    void *h = open_lib("libnvidia-ml.so.1", LIB_NVML, &idx, &x);
    if (h) {
        RESOLVE(h, nvmlDeviceGetUUID, "nvmlDeviceGetUUID");
        RESOLVE(h, nvmlDeviceGetIndex, "nvmlDeviceGetIndex");
    }
}
