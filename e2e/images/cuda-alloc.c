/* A CUDA driver-API client for pods: allocates MIB of device memory on GPU 0 with
 * cuMemAlloc, prints "allocated <MIB>", holds it for SECONDS, frees it and prints "freed".
 * Usage: cuda-alloc MIB [SECONDS]. libcuda.so.1 comes from what the node mounts. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int check(CUresult result, const char *what) {
    if (result == CUDA_SUCCESS)
        return 0;
    const char *name = "?";
    cuGetErrorName(result, &name);
    fprintf(stderr, "cuda-alloc: %s failed: %s\n", what, name);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("usage: cuda-alloc MIB [SECONDS]\n", stderr);
        return 2;
    }
    size_t mib = strtoull(argv[1], NULL, 10);
    unsigned seconds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 0;
    CUdevice device;
    CUcontext context;
    CUdeviceptr pointer;
    if (check(cuInit(0), "cuInit") || check(cuDeviceGet(&device, 0), "cuDeviceGet") ||
        check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain") ||
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent") ||
        check(cuMemAlloc(&pointer, mib << 20), "cuMemAlloc"))
        return 1;
    printf("allocated %zu\n", mib);
    fflush(stdout);
    sleep(seconds);
    if (check(cuMemFree(pointer), "cuMemFree"))
        return 1;
    puts("freed");
    return 0;
}
