/* A CUDA driver-API client for pods that keeps GPU 0 busy: launches kernels of 1..MAXBLOCKS
 * blocks (random, seeded) for SECONDS (0: until killed), as fast as the driver (and
 * libtessera's core budget) lets it, then prints "launches <n>". While PAUSEFILE exists it
 * launches nothing (it waits for its queue to drain and polls every 10 ms): the tests make
 * a container idle and busy again with `kubectl exec ... touch/rm PAUSEFILE`.
 * Usage: cuda-spin SECONDS MAXBLOCKS SEED [PAUSEFILE]. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char ptx[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n";

static int check(CUresult result, const char *what) {
    if (result == CUDA_SUCCESS)
        return 0;
    const char *name = "?";
    cuGetErrorName(result, &name);
    fprintf(stderr, "cuda-spin: %s failed: %s\n", what, name);
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fputs("usage: cuda-spin SECONDS MAXBLOCKS SEED [PAUSEFILE]\n", stderr);
        return 2;
    }
    double seconds = strtod(argv[1], NULL);
    unsigned maxblocks = (unsigned)strtoul(argv[2], NULL, 10);
    const char *pause_file = argc > 4 ? argv[4] : NULL;
    if (maxblocks == 0)
        maxblocks = 1;
    srand((unsigned)strtoul(argv[3], NULL, 10));
    CUdevice device;
    CUcontext context;
    CUmodule module;
    CUfunction kernel;
    if (check(cuInit(0), "cuInit") || check(cuDeviceGet(&device, 0), "cuDeviceGet") ||
        check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain") ||
        check(cuCtxSetCurrent(context), "cuCtxSetCurrent") ||
        check(cuModuleLoadData(&module, ptx), "cuModuleLoadData") ||
        check(cuModuleGetFunction(&kernel, module, "k"), "cuModuleGetFunction"))
        return 1;
    double end = seconds > 0 ? now_s() + seconds : 0;
    long launches = 0;
    while (end == 0 || now_s() < end) {
        if (pause_file && access(pause_file, F_OK) == 0) {
            if (check(cuCtxSynchronize(), "cuCtxSynchronize"))
                return 1;
            usleep(10000);
            continue;
        }
        unsigned blocks = 1 + (unsigned)rand() % maxblocks;
        if (check(cuLaunchKernel(kernel, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL),
                  "cuLaunchKernel"))
            return 1;
        launches++;
    }
    if (check(cuCtxSynchronize(), "cuCtxSynchronize"))
        return 1;
    printf("launches %ld\n", launches);
    return 0;
}
