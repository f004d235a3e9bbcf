/* An NVML client for pods, what `nvidia-smi --query-gpu=index,name,uuid,memory.total,
 * memory.used,memory.free --format=csv,noheader,nounits` prints: one line per GPU, memory in
 * MiB, through nvmlDeviceGetMemoryInfo (as nvidia-smi reads it), each MIG-enabled GPU's MIG
 * devices under it ("<gpu>:<mig index>, name, uuid, total, used, free", the MIG devices by
 * index), then "gpus <count>". libnvidia-ml.so.1 comes from what the node mounts. */
#include <nvml.h>
#include <stdio.h>

static int check(nvmlReturn_t result, const char *what) {
    if (result == NVML_SUCCESS)
        return 0;
    fprintf(stderr, "nvml-info: %s failed: %s\n", what, nvmlErrorString(result));
    return 1;
}

int main(void) {
    unsigned count = 0;
    if (check(nvmlInit_v2(), "nvmlInit") || check(nvmlDeviceGetCount_v2(&count), "nvmlDeviceGetCount"))
        return 1;
    for (unsigned index = 0; index < count; index++) {
        nvmlDevice_t device;
        nvmlMemory_t memory;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        if (check(nvmlDeviceGetHandleByIndex_v2(index, &device), "nvmlDeviceGetHandleByIndex") ||
            check(nvmlDeviceGetName(device, name, sizeof name), "nvmlDeviceGetName") ||
            check(nvmlDeviceGetUUID(device, uuid, sizeof uuid), "nvmlDeviceGetUUID") ||
            check(nvmlDeviceGetMemoryInfo(device, &memory), "nvmlDeviceGetMemoryInfo"))
            return 1;
        printf("%u, %s, %s, %llu, %llu, %llu\n", index, name, uuid, memory.total >> 20,
               memory.used >> 20, memory.free >> 20);
        unsigned current = 0, pending = 0, max = 0;
        if (nvmlDeviceGetMigMode(device, &current, &pending) != NVML_SUCCESS || !current)
            continue;
        if (check(nvmlDeviceGetMaxMigDeviceCount(device, &max), "nvmlDeviceGetMaxMigDeviceCount"))
            return 1;
        for (unsigned k = 0; k < max; k++) {
            nvmlDevice_t mig;
            if (nvmlDeviceGetMigDeviceHandleByIndex(device, k, &mig) != NVML_SUCCESS)
                break;
            if (check(nvmlDeviceGetName(mig, name, sizeof name), "nvmlDeviceGetName") ||
                check(nvmlDeviceGetUUID(mig, uuid, sizeof uuid), "nvmlDeviceGetUUID") ||
                check(nvmlDeviceGetMemoryInfo(mig, &memory), "nvmlDeviceGetMemoryInfo"))
                return 1;
            printf("%u:%u, %s, %s, %llu, %llu, %llu\n", index, k, name, uuid,
                   memory.total >> 20, memory.used >> 20, memory.free >> 20);
        }
    }
    printf("gpus %u\n", count);
    nvmlShutdown();
    return 0;
}
