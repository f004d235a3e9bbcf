/* Driver API behaviour of the fake libcuda.  Needs TESSERA_SIM_NODE pointing at a node whose
 * GPU 0 is a whole (non-MIG) H100-80GB and default_ns_per_block=1000. */
#include <cuda.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static const char *module_text =
    ".tessera_sim_module\n"
    "kernel busy ns_per_block=100000\n"
    "kernel param_cost cost_param=1\n";

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    size_t free_b, total_b;
    int n = 0, v = 0;
    const char *s = NULL;

    CHECK_EQ(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK_EQ(cuDriverGetVersion(&v), CUDA_SUCCESS);
    CHECK(v >= 12000);
    CHECK_EQ(cuDeviceGetCount(&n), CUDA_SUCCESS);
    CHECK(n >= 1);
    CHECK_EQ(cuDeviceGet(&dev, n), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    char name[128];
    CHECK_EQ(cuDeviceGetName(name, sizeof name, dev), CUDA_SUCCESS);
    CHECK(strcmp(name, "NVIDIA H100 80GB HBM3") == 0);
    CHECK_EQ(cuDeviceTotalMem(&total_b, dev), CUDA_SUCCESS);
    CHECK_EQ(total_b, 81559ULL << 20);
    CHECK_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), CUDA_SUCCESS);
    CHECK_EQ(v, 132);
    CHECK_EQ(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), CUDA_SUCCESS);
    CHECK_EQ(v, 9);
    CHECK_EQ(cuDeviceGetAttribute(&v, (CUdevice_attribute)100000, dev), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    CHECK(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK_EQ(cuGetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    CHECK(strcmp(s, "out of memory") == 0);
    CHECK_EQ(cuGetErrorString((CUresult)123456, &s), CUDA_ERROR_INVALID_VALUE);

    /* No context yet. */
    CUdeviceptr p;
    CHECK_EQ(cuMemAlloc(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);

    /* Classic allocations are charged against the device. */
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    size_t free0 = free_b;
    CHECK_EQ(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemAlloc(&p, 64 << 20), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 64 << 20);
    unsigned char host[256], back[256];
    for (int i = 0; i < 256; i++)
        host[i] = (unsigned char)i;
    CHECK_EQ(cuMemcpyHtoD(p, host, sizeof host), CUDA_SUCCESS);
    CHECK_EQ(cuMemcpyDtoH(back, p, sizeof back), CUDA_SUCCESS);
    CHECK(memcmp(host, back, sizeof host) == 0);
    CHECK_EQ(cuMemcpyHtoD(p + (64 << 20) - 8, host, 16), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
    CHECK_EQ(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemAlloc(&p, (size_t)100 << 30), CUDA_ERROR_OUT_OF_MEMORY);

    /* Pitch, managed, arrays. */
    size_t pitch = 0;
    CHECK_EQ(cuMemAllocPitch(&p, &pitch, 1000, 10, 3), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemAllocPitch(&p, &pitch, 1000, 10, 4), CUDA_SUCCESS);
    CHECK_EQ(pitch, 1024);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 10240);
    CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocManaged(&p, 1 << 20, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 1 << 20);
    CHECK_EQ(cuMemFree(p), CUDA_SUCCESS);
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 512, .Height = 512, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CHECK_EQ(cuArrayCreate(&arr, &ad), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 512 * 512 * 16);
    CHECK_EQ(cuArrayDestroy(arr), CUDA_SUCCESS);

    /* Stream-ordered allocator: memory stays in the pool until a sync trims it. */
    CUstream st;
    CHECK_EQ(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocAsync(&p, 8 << 20, st), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 8 << 20);
    CHECK_EQ(cuMemFreeAsync(p, st), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 8 << 20);
    CHECK_EQ(cuStreamSynchronize(st), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);
    CUmemoryPool pool;
    CUmemPoolProps pp = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                         .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CHECK_EQ(cuMemPoolCreate(&pool, &pp), CUDA_SUCCESS);
    cuuint64_t thr = 1ULL << 30, cur = 0;
    CHECK_EQ(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr), CUDA_SUCCESS);
    CHECK_EQ(cuMemAllocFromPoolAsync(&p, 4 << 20, pool, st), CUDA_SUCCESS);
    CHECK_EQ(cuMemFreeAsync(p, st), CUDA_SUCCESS);
    CHECK_EQ(cuStreamSynchronize(st), CUDA_SUCCESS);
    CHECK_EQ(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &cur), CUDA_SUCCESS);
    CHECK_EQ(cur, 4 << 20); /* under the release threshold: kept */
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 4 << 20);
    CHECK_EQ(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);
    CHECK_EQ(cuMemPoolDestroy(pool), CUDA_SUCCESS);

    /* Virtual memory management: physical memory is charged at cuMemCreate. */
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t gran = 0;
    CHECK_EQ(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    CHECK_EQ(gran, 2 << 20);
    CUmemGenericAllocationHandle h;
    CHECK_EQ(cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemCreate(&h, 4 * gran, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 4 * gran);
    CUdeviceptr va;
    CHECK_EQ(cuMemAddressReserve(&va, 4 * gran, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemMap(va, 4 * gran, 0, h, 0), CUDA_SUCCESS);
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK_EQ(cuMemSetAccess(va, 4 * gran, &acc, 1), CUDA_SUCCESS);
    CHECK_EQ(cuMemsetD32(va, 0xdeadbeef, 16), CUDA_SUCCESS);
    unsigned w = 0;
    CHECK_EQ(cuMemcpyDtoH(&w, va + 8, 4), CUDA_SUCCESS);
    CHECK_EQ(w, 0xdeadbeef);
    CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS); /* still mapped: memory stays */
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 4 * gran);
    CHECK_EQ(cuMemUnmap(va, 4 * gran), CUDA_SUCCESS);
    CHECK_EQ(cuMemAddressFree(va, 4 * gran), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);

    /* Physical memory needs no current context (the real driver's cuMemCreate does not). */
    CHECK_EQ(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemCreate(&h, 2 * gran, &prop, 0), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 2 * gran);
    CHECK_EQ(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(cuMemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);

    /* Registered host memory: page-locked in place, not device memory. */
    static char hostbuf[3 * 4096] __attribute__((aligned(4096)));
    CHECK_EQ(cuMemHostRegister(hostbuf, 2 * 4096, 7u << 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMemHostRegister(hostbuf, 2 * 4096, CU_MEMHOSTREGISTER_DEVICEMAP), CUDA_SUCCESS);
    CHECK_EQ(cuMemHostRegister(hostbuf + 4096, 4096, 0), CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CHECK_EQ(cuMemHostRegister(hostbuf + 2 * 4096, 4096, 0), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);
    CHECK_EQ(cuMemHostUnregister(hostbuf + 1), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK_EQ(cuMemHostUnregister(hostbuf), CUDA_SUCCESS);
    CHECK_EQ(cuMemHostUnregister(hostbuf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK_EQ(cuMemHostUnregister(hostbuf + 2 * 4096), CUDA_SUCCESS);

    /* Mipmapped arrays: every level is charged (rows padded to 512 bytes). */
    CUmipmappedArray mm;
    CUDA_ARRAY3D_DESCRIPTOR md = {.Width = 256, .Height = 256, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    CHECK_EQ(cuMipmappedArrayCreate(&mm, &md, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMipmappedArrayCreate(&mm, &md, 10), CUDA_ERROR_INVALID_VALUE); /* 256: 9 levels */
    CHECK_EQ(cuMipmappedArrayCreate(&mm, &md, 3), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 1024 * 256 + 512 * 128 + 512 * 64);
    CUarray lvl;
    CUDA_ARRAY_DESCRIPTOR ld;
    CHECK_EQ(cuMipmappedArrayGetLevel(&lvl, mm, 3), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuMipmappedArrayGetLevel(&lvl, mm, 2), CUDA_SUCCESS);
    CHECK_EQ(cuArrayGetDescriptor(&ld, lvl), CUDA_SUCCESS);
    CHECK_EQ(ld.Width, 64);
    CHECK_EQ(ld.Height, 64);
    CHECK_EQ(cuMipmappedArrayDestroy(mm), CUDA_SUCCESS);
    CHECK_EQ(cuMipmappedArrayDestroy(mm), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cuArrayGetDescriptor(&ld, lvl), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);

    /* Modules and the kernel time model: 10 blocks x 100 us = 1 ms per launch. */
    CUmodule mod;
    CUfunction f, fp;
    CHECK_EQ(cuModuleLoadData(&mod, "garbage"), CUDA_ERROR_INVALID_IMAGE);
    CHECK_EQ(cuModuleLoadData(&mod, module_text), CUDA_SUCCESS);
    CHECK_EQ(cuModuleGetFunction(&f, mod, "nope"), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(cuModuleGetFunction(&f, mod, "busy"), CUDA_SUCCESS);
    CHECK_EQ(cuModuleGetFunction(&fp, mod, "param_cost"), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, st, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuLaunchKernel(f, 1, 1, 1, 2048, 1, 1, 0, st, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    uint64_t t0 = now_ns();
    for (int i = 0; i < 20; i++)
        CHECK_EQ(cuLaunchKernel(f, 10, 1, 1, 128, 1, 1, 0, st, NULL, NULL), CUDA_SUCCESS);
    uint64_t t_launch = now_ns() - t0;
    CHECK(t_launch < 10000000ULL); /* asynchronous */
    CHECK_EQ(cuStreamQuery(st), CUDA_ERROR_NOT_READY);
    CHECK_EQ(cuStreamSynchronize(st), CUDA_SUCCESS);
    uint64_t t_sync = now_ns() - t0;
    CHECK(t_sync >= 20000000ULL && t_sync < 40000000ULL);
    CHECK_EQ(cuStreamQuery(st), CUDA_SUCCESS);

    /* Cost from a kernel parameter; events time it. */
    CUevent e0, e1;
    float ms = 0;
    CHECK_EQ(cuEventCreate(&e0, 0), CUDA_SUCCESS);
    CHECK_EQ(cuEventCreate(&e1, 0), CUDA_SUCCESS);
    unsigned long long per_block = 500000, dummy = 0;
    void *params[] = {&dummy, &per_block};
    CHECK_EQ(cuLaunchKernel(fp, 4, 1, 1, 32, 1, 1, 0, st, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cuEventRecord(e0, st), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(fp, 4, 1, 1, 32, 1, 1, 0, st, params, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuEventRecord(e1, st), CUDA_SUCCESS);
    CHECK_EQ(cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_NOT_READY);
    CHECK_EQ(cuEventSynchronize(e1), CUDA_SUCCESS);
    CHECK_EQ(cuEventElapsedTime(&ms, e0, e1), CUDA_SUCCESS);
    CHECK(ms >= 1.999f && ms < 3.0f);

    /* cuLaunchKernelEx and cooperative limits. */
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE, .value = {.cooperative = 1}};
    CUlaunchConfig cfg = {.gridDimX = 132 * 2, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1024, .blockDimY = 1,
                          .blockDimZ = 1, .hStream = st, .attrs = &attr, .numAttrs = 1};
    CHECK_EQ(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_SUCCESS);
    cfg.gridDimX = 132 * 2 + 1;
    CHECK_EQ(cuLaunchKernelEx(&cfg, f, NULL, NULL), CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    CHECK_EQ(cuLaunchCooperativeKernel(f, 132 * 2 + 1, 1, 1, 1024, 1, 1, 0, st, NULL),
             CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);

    /* Graphs: two kernel nodes, 1 ms each. */
    CUgraph g;
    CUgraphNode n1, n2;
    CUgraphExec ge;
    CHECK_EQ(cuGraphCreate(&g, 0), CUDA_SUCCESS);
    CUDA_KERNEL_NODE_PARAMS kp = {.func = f, .gridDimX = 10, .gridDimY = 1, .gridDimZ = 1,
                                  .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
    CHECK_EQ(cuGraphAddKernelNode(&n1, g, NULL, 0, &kp), CUDA_SUCCESS);
    CHECK_EQ(cuGraphAddKernelNode(&n2, g, &n1, 1, &kp), CUDA_SUCCESS);
    CHECK_EQ(cuGraphInstantiate(&ge, g, 0), CUDA_SUCCESS);
    CHECK_EQ(cuStreamSynchronize(st), CUDA_SUCCESS);
    CHECK_EQ(cuEventRecord(e0, st), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(ge, st), CUDA_SUCCESS);
    CHECK_EQ(cuEventRecord(e1, st), CUDA_SUCCESS);
    CHECK_EQ(cuEventSynchronize(e1), CUDA_SUCCESS);
    CHECK_EQ(cuEventElapsedTime(&ms, e0, e1), CUDA_SUCCESS);
    if (!(ms >= 1.999f && ms < 3.0f))
        fprintf(stderr, "graph ms=%f\n", ms);
    CHECK(ms >= 1.999f && ms < 3.0f);
    CHECK_EQ(cuGraphExecDestroy(ge), CUDA_SUCCESS);
    CHECK_EQ(cuGraphDestroy(g), CUDA_SUCCESS);

    /* cuGetProcAddress is version-aware. */
    void *fn = NULL;
    CUdriverProcAddressQueryResult qr;
    CHECK_EQ(cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, &qr), CUDA_SUCCESS);
    CHECK(fn == (void *)cuMemAlloc_v2);
    CHECK_EQ(cuGetProcAddress("cuCtxCreate", &fn, 11000, 0, &qr), CUDA_SUCCESS);
    CHECK(fn == (void *)cuCtxCreate_v2);
    CHECK_EQ(cuGetProcAddress("cuCtxCreate", &fn, 12090, 0, &qr), CUDA_SUCCESS);
    CHECK(fn == (void *)cuCtxCreate_v4);
    CHECK_EQ(cuGetProcAddress("cuGraphAddKernelNode", &fn, 12000, 0, &qr), CUDA_SUCCESS);
    CHECK(fn == (void *)cuGraphAddKernelNode_v2);
    CHECK_EQ(cuGetProcAddress("cuMemAllocAsync", &fn, 11000, 0, &qr), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(qr, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK_EQ(cuGetProcAddress("cuNoSuchThing", &fn, 12090, 0, &qr), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(qr, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK(fn == NULL);

    /* Explicit contexts; destroying one frees what it allocated. */
    CUcontext c2;
    CHECK_EQ(cuCtxCreate(&c2, 0, dev), CUDA_SUCCESS);
    CHECK_EQ(cuMemAlloc(&p, 32 << 20), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 32 << 20);
    CHECK_EQ(cuCtxDestroy(c2), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CHECK_EQ(cuMemGetInfo(&free_b, &total_b), CUDA_SUCCESS);
    CHECK_EQ(free0 - free_b, 0);

    CHECK_EQ(cuModuleUnload(mod), CUDA_SUCCESS);
    CHECK_EQ(cuStreamDestroy(st), CUDA_SUCCESS);
    CHECK_EQ(cuEventDestroy(e0), CUDA_SUCCESS);
    CHECK_EQ(cuEventDestroy(e1), CUDA_SUCCESS);
    CHECK_EQ(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
    CHECK_DONE();
}
