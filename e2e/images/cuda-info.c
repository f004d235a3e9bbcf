/* A CUDA driver-API client for pods: lists the GPUs the container sees, one line each,
 * "<index> <name> <uuid> <total MiB> <free MiB>", then "devices <count>". Linked against
 * libcuda.so.1 like any CUDA program; the library comes from what the node mounts into the
 * container (the image has none), so a container without one fails at start-up. */
#include <cuda.h>
#include <stdio.h>

static int check(CUresult result, const char *what) {
    if (result == CUDA_SUCCESS)
        return 0;
    const char *name = "?";
    cuGetErrorName(result, &name);
    fprintf(stderr, "cuda-info: %s failed: %s\n", what, name);
    return 1;
}

int main(void) {
    int count = 0;
    if (check(cuInit(0), "cuInit") || check(cuDeviceGetCount(&count), "cuDeviceGetCount"))
        return 1;
    for (int index = 0; index < count; index++) {
        CUdevice device;
        CUcontext context;
        CUuuid uuid;
        char name[128];
        size_t free_bytes = 0, total_bytes = 0;
        if (check(cuDeviceGet(&device, index), "cuDeviceGet") ||
            check(cuDeviceGetName(name, sizeof name, device), "cuDeviceGetName") ||
            check(cuDeviceGetUuid(&uuid, device), "cuDeviceGetUuid") ||
            check(cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain") ||
            check(cuCtxSetCurrent(context), "cuCtxSetCurrent") ||
            check(cuMemGetInfo(&free_bytes, &total_bytes), "cuMemGetInfo"))
            return 1;
        printf("%d %s GPU-", index, name);
        for (int i = 0; i < 16; i++)
            printf("%s%02x", i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "",
                   (unsigned char)uuid.bytes[i]);
        printf(" %zu %zu\n", total_bytes >> 20, free_bytes >> 20);
        cuDevicePrimaryCtxRelease(device);
    }
    printf("devices %d\n", count);
    return 0;
}
