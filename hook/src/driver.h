/* libtessera: the driver's own entry points (driver.c).  libcuda.so.1 and libnvidia-ml.so.1
 * are opened on the first hooked call and every name of hooks.def is resolved in them
 * (REAL(name)), with the few entry points the library calls without hooking them (drv). */
#ifndef TESSERA_DRIVER_H
#define TESSERA_DRIVER_H

#include "hook.h"

#pragma GCC visibility push(hidden)

/* The library a row of hooks.def names (its first column). */
enum th_lib { LIB_CU, LIB_NVML };

/* One index per row of hooks.def. */
enum {
#define H(lib, name, base, ver, ptsz, cls) IDX_##name,
#include "hooks.def"
#undef H
    IDX_COUNT
};

/* The driver's function behind each hook (NULL: not found). */
extern void *real_ptr[IDX_COUNT];
#define REAL(name) ((__typeof__(&name))real_ptr[IDX_##name])

#define REAL_OR_FAIL(name)                              \
    do {                                                \
        if (UNLIKELY(!REAL(name)))                      \
            return CUDA_ERROR_NOT_SUPPORTED;            \
    } while (0)

/* Driver entry points the library calls but does not hook (NULL: not found). */
struct driver_calls {
    CUresult (*cuCtxGetDevice)(CUdevice *);
    CUresult (*cuDeviceGetCount)(int *);
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuGraphGetNodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*cuGraphNodeGetType)(CUgraphNode, CUgraphNodeType *);
    CUresult (*cuGraphChildGraphNodeGetGraph)(CUgraphNode, CUgraph *);
    CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
    CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    nvmlReturn_t (*nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*nvmlDeviceGetIndex)(nvmlDevice_t, unsigned int *);
};
extern struct driver_calls drv;

/* Open each library and resolve its names, once (pthread_once with these). */
extern pthread_once_t cu_once, nvml_once;
void cu_init(void);
void nvml_init(void);

#pragma GCC visibility pop
#endif
