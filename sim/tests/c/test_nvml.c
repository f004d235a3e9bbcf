/* NVML behaviour of the fake libnvidia-ml, incl. bad arguments.  Needs TESSERA_SIM_NODE with
 * GPU 0 an A100-40GB in MIG mode and GPU 1 an H100-80GB without. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <nvml.h>
#include <string.h>

#include "check.h"

int main(void)
{
    unsigned n = 0, cur = 0, pend = 0, cnt = 0;
    nvmlDevice_t a100, h100, mig;
    char buf[96];

    CHECK_EQ(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
    CHECK_EQ(n, 2);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(0, &a100), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(1, &h100), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetName(a100, buf, 4), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(nvmlDeviceGetName(a100, buf, sizeof buf), NVML_SUCCESS);
    CHECK(strcmp(buf, "NVIDIA A100-SXM4-40GB") == 0);
    CHECK_EQ(nvmlDeviceGetName(NULL, buf, sizeof buf), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetName((nvmlDevice_t)buf, buf, sizeof buf), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetMigMode(a100, &cur, &pend), NVML_SUCCESS);
    CHECK_EQ(cur, 1);

    /* Profile info: index in, unique ID out. */
    nvmlGpuInstanceProfileInfo_t pi;
    CHECK_EQ(nvmlDeviceGetGpuInstanceProfileInfo(a100, NVML_GPU_INSTANCE_PROFILE_3_SLICE, &pi), NVML_SUCCESS);
    CHECK_EQ(pi.id, 9);
    CHECK_EQ(pi.memorySizeMB, 20096);
    CHECK_EQ(pi.multiprocessorCount, 42);
    CHECK_EQ(nvmlDeviceGetGpuInstanceProfileInfo(a100, 999, &pi), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceGetGpuInstanceProfileInfo(h100, NVML_GPU_INSTANCE_PROFILE_3_SLICE, &pi), NVML_SUCCESS);
    nvmlGpuInstanceProfileInfo_v2_t pv = {.version = nvmlGpuInstanceProfileInfo_v2};
    CHECK_EQ(nvmlDeviceGetGpuInstanceProfileInfoV(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE, &pv), NVML_SUCCESS);
    CHECK(strcmp(pv.name, "MIG 1g.5gb") == 0);
    pv.version = 12345;
    CHECK_EQ(nvmlDeviceGetGpuInstanceProfileInfoV(a100, 0, &pv), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    nvmlGpuInstancePlacement_t pl[8];
    cnt = 1;
    CHECK_EQ(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 19, pl, &cnt), NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK_EQ(cnt, 7);
    cnt = 8;
    CHECK_EQ(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 9, pl, &cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 2);
    CHECK_EQ(pl[1].start, 4);
    CHECK_EQ(pl[1].size, 4);

    /* Create with and without placement; creation on a non-MIG GPU is not supported. */
    nvmlGpuInstance_t gi, gi2;
    nvmlGpuInstanceInfo_t info;
    nvmlGpuInstancePlacement_t want = {.start = 0, .size = 4};
    CHECK_EQ(nvmlDeviceCreateGpuInstance(h100, 9, &gi), NVML_ERROR_NOT_SUPPORTED);
    CHECK_EQ(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, NULL, &gi), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &want, &gi), NVML_SUCCESS);
    CHECK_EQ(nvmlGpuInstanceGetInfo(gi, &info), NVML_SUCCESS);
    CHECK_EQ(info.id, 1);
    CHECK_EQ(info.profileId, 9);
    CHECK_EQ(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &want, &gi2), NVML_ERROR_INSUFFICIENT_RESOURCES);
    CHECK_EQ(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19, &cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 3); /* slots 4, 5, 6 */
    CHECK_EQ(nvmlDeviceCreateGpuInstance(a100, 9, &gi2), NVML_SUCCESS);
    CHECK_EQ(nvmlGpuInstanceGetInfo(gi2, &info), NVML_SUCCESS);
    CHECK_EQ(info.placement.start, 4);

    /* Compute instances. */
    nvmlComputeInstance_t ci[4];
    nvmlComputeInstanceInfo_t cinfo;
    nvmlComputeInstancePlacement_t cpl = {.start = 1, .size = 1};
    CHECK_EQ(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, &ci[0]), NVML_ERROR_NOT_SUPPORTED);
    CHECK_EQ(nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &cpl, &ci[0]), NVML_SUCCESS);
    CHECK_EQ(nvmlComputeInstanceGetInfo_v2(ci[0], &cinfo), NVML_SUCCESS);
    CHECK_EQ(cinfo.placement.start, 1);
    CHECK_EQ(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &ci[1]), NVML_SUCCESS);
    CHECK_EQ(nvmlComputeInstanceGetInfo_v2(ci[1], &cinfo), NVML_SUCCESS);
    CHECK_EQ(cinfo.placement.start, 0);
    CHECK_EQ(cinfo.id, 1);
    CHECK_EQ(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, &ci[2]), NVML_ERROR_INSUFFICIENT_RESOURCES);
    CHECK_EQ(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 1);

    /* MIG device handles. */
    CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(a100, 0, &mig), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(a100, 2, &mig), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(a100, 1, &mig), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetComputeInstanceId(mig, &cnt), NVML_SUCCESS);
    CHECK_EQ(cnt, 1);
    CHECK_EQ(nvmlDeviceGetUUID(mig, buf, sizeof buf), NVML_SUCCESS);
    CHECK(strncmp(buf, "MIG-", 4) == 0);
    nvmlDevice_t same;
    CHECK_EQ(nvmlDeviceGetHandleByUUID(buf, &same), NVML_SUCCESS);
    CHECK(same == mig);
    nvmlMemory_t mem;
    CHECK_EQ(nvmlDeviceGetMemoryInfo(mig, &mem), NVML_SUCCESS);
    CHECK_EQ(mem.total, 20096ULL << 20);

    /* Destroy order: CIs first. */
    CHECK_EQ(nvmlGpuInstanceDestroy(gi), NVML_ERROR_IN_USE);
    CHECK_EQ(nvmlComputeInstanceDestroy(ci[0]), NVML_SUCCESS);
    CHECK_EQ(nvmlComputeInstanceDestroy(ci[0]), NVML_ERROR_INVALID_ARGUMENT);
    CHECK_EQ(nvmlComputeInstanceDestroy(ci[1]), NVML_SUCCESS);
    CHECK_EQ(nvmlGpuInstanceDestroy(gi), NVML_SUCCESS);
    CHECK_EQ(nvmlGpuInstanceDestroy(gi2), NVML_SUCCESS);
    CHECK_EQ(nvmlGpuInstanceGetInfo(gi, &info), NVML_ERROR_INVALID_ARGUMENT);

    /* Processes: none yet; the size protocol. */
    cnt = 0;
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(h100, &cnt, NULL), NVML_SUCCESS);
    CHECK_EQ(cnt, 0);
    CHECK_EQ(nvmlDeviceGetComputeRunningProcesses_v3(h100, NULL, NULL), NVML_ERROR_INVALID_ARGUMENT);

    /* A call the simulator does not model. */
    unsigned power = 0;
    CHECK_EQ(nvmlDeviceGetPowerUsage(h100, &power), NVML_ERROR_NOT_SUPPORTED);
    CHECK(strcmp(nvmlErrorString(NVML_ERROR_INSUFFICIENT_RESOURCES), "Insufficient Resources") == 0);
    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);
    CHECK_EQ(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    CHECK_DONE();
}
