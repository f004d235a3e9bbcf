/* Device files and what a process sees through them (simdev.c): the node's files, the
 * driver's capability minors, and NVML and CUDA in a "container" whose device directory
 * (TESSERA_SIM_DEV) holds GPU 1, GPU 2 and one of GPU 2's three MIG devices.  Needs
 * TESSERA_SIM_NODE with GPUs H100-80GB, H100-80GB, A100-40GB:mig (state beside it) and
 * TEST_DEV_DIR, an empty directory to use as the container's. */
#define NVML_NO_UNVERSIONED_FUNC_DEFS 1
#include <cuda.h>
#include <fcntl.h>
#include <libgen.h>
#include <nvml.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static char root[4096];

static int exists(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int exists(const char *fmt, ...)
{
    char path[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(path, sizeof path, fmt, ap);
    va_end(ap);
    return access(path, F_OK) == 0;
}

/* The minor mig-minors gives a capability ("gpu2/gi13/access"); -1 when absent. */
static int minor_of(const char *cap)
{
    char path[8192], name[128];
    int minor, found = -1;
    snprintf(path, sizeof path, "%s/proc/driver/nvidia-caps/mig-minors", root);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    while (fscanf(f, "%127s %d", name, &minor) == 2)
        if (!strcmp(name, cap))
            found = minor;
    fclose(f);
    return found;
}

/* Put the device file of capability `cap` (host: root/dev/nvidia-caps/) into dir. */
static void give_cap(const char *dir, const char *cap)
{
    char path[8192];
    int minor = minor_of(cap);
    CHECK(minor > 0);
    CHECK(exists("%s/dev/nvidia-caps/nvidia-cap%d", root, minor));
    snprintf(path, sizeof path, "%s/nvidia-caps/nvidia-cap%d", dir, minor);
    close(open(path, O_CREAT | O_WRONLY, 0644));
}

static void give(const char *dir, const char *name)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    close(open(path, O_CREAT | O_WRONLY, 0644));
}

int main(void)
{
    const char *dir = getenv("TEST_DEV_DIR");
    char node[4096], buf[96], uuid[3][96], mig_uuid[3][96], bus0[32];
    unsigned n = 0, gi_id[3], v = 0;
    nvmlDevice_t d, gpu[3], mig;
    if (!dir || !getenv("TESSERA_SIM_NODE")) {
        fprintf(stderr, "TESSERA_SIM_NODE and TEST_DEV_DIR are needed\n");
        return 2;
    }
    snprintf(node, sizeof node, "%s", getenv("TESSERA_SIM_NODE"));
    snprintf(root, sizeof root, "%s", dirname(node));

    /* The host: every GPU, its device file; three 1g.5gb instances on GPU 2. */
    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
    CHECK_EQ(n, 3);
    for (unsigned i = 0; i < 3; i++) {
        CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(i, &gpu[i]), NVML_SUCCESS);
        CHECK_EQ(nvmlDeviceGetUUID(gpu[i], uuid[i], sizeof uuid[i]), NVML_SUCCESS);
        CHECK(exists("%s/dev/nvidia%u", root, i));
    }
    CHECK(!exists("%s/dev/nvidia3", root));
    nvmlPciInfo_t pci;
    CHECK_EQ(nvmlDeviceGetPciInfo_v3(gpu[0], &pci), NVML_SUCCESS);
    snprintf(bus0, sizeof bus0, "%s", pci.busId);
    for (int k = 0; k < 3; k++) {
        nvmlGpuInstance_t gi;
        nvmlComputeInstance_t ci;
        nvmlGpuInstanceInfo_t info;
        CHECK_EQ(nvmlDeviceCreateGpuInstance(gpu[2], 19 /* 1g.5gb */, &gi), NVML_SUCCESS);
        CHECK_EQ(nvmlGpuInstanceCreateComputeInstance(gi, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, &ci), NVML_SUCCESS);
        CHECK_EQ(nvmlGpuInstanceGetInfo(gi, &info), NVML_SUCCESS);
    }
    for (unsigned k = 0; k < 3; k++) {
        CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(gpu[2], k, &mig), NVML_SUCCESS);
        CHECK_EQ(nvmlDeviceGetUUID(mig, mig_uuid[k], sizeof mig_uuid[k]), NVML_SUCCESS);
        CHECK_EQ(nvmlDeviceGetGpuInstanceId(mig, &gi_id[k]), NVML_SUCCESS);
    }
    /* the driver's numbering: 3 + 135 per GPU + 9 per GPU instance (+ 1 + the CI ID) */
    snprintf(buf, sizeof buf, "gpu2/gi%u/access", gi_id[1]);
    CHECK_EQ(minor_of(buf), 3 + 2 * 135 + (int)gi_id[1] * 9);
    snprintf(buf, sizeof buf, "gpu2/gi%u/ci0/access", gi_id[1]);
    CHECK_EQ(minor_of(buf), 3 + 2 * 135 + (int)gi_id[1] * 9 + 1);
    CHECK_EQ(minor_of("config"), 1);
    CHECK_EQ(minor_of("monitor"), 2);
    CHECK_EQ(minor_of("gpu31/gi14/ci7/access"), 3 + 32 * 135 - 1);
    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);

    /* The container: GPUs 1 and 2, and on GPU 2 the second MIG device only. */
    char caps[8192];
    snprintf(caps, sizeof caps, "%s/nvidia-caps", dir);
    mkdir(caps, 0755);
    give(dir, "nvidia1");
    give(dir, "nvidia2");
    snprintf(buf, sizeof buf, "gpu2/gi%u/access", gi_id[1]);
    give_cap(dir, buf);
    snprintf(buf, sizeof buf, "gpu2/gi%u/ci0/access", gi_id[1]);
    give_cap(dir, buf);
    /* another instance's GI access alone is not its MIG device */
    snprintf(buf, sizeof buf, "gpu2/gi%u/access", gi_id[2]);
    give_cap(dir, buf);
    setenv("TESSERA_SIM_DEV", dir, 1);

    CHECK_EQ(nvmlInit_v2(), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetCount_v2(&n), NVML_SUCCESS);
    CHECK_EQ(n, 2);
    CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(2, &d), NVML_ERROR_INVALID_ARGUMENT);
    for (unsigned i = 0; i < 2; i++) {
        CHECK_EQ(nvmlDeviceGetHandleByIndex_v2(i, &d), NVML_SUCCESS);
        CHECK_EQ(nvmlDeviceGetUUID(d, buf, sizeof buf), NVML_SUCCESS);
        CHECK(!strcmp(buf, uuid[i + 1]));
        CHECK_EQ(nvmlDeviceGetIndex(d, &v), NVML_SUCCESS);
        CHECK_EQ(v, i);            /* re-indexed from 0 */
        CHECK_EQ(nvmlDeviceGetMinorNumber(d, &v), NVML_SUCCESS);
        CHECK_EQ(v, i + 1);        /* the device file's own */
        gpu[i] = d;
    }
    CHECK_EQ(nvmlDeviceGetHandleByUUID(uuid[0], &d), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(uuid[2], &d), NVML_SUCCESS);
    CHECK(d == gpu[1]);
    CHECK_EQ(nvmlDeviceGetHandleByPciBusId_v2(bus0, &d), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(gpu[1], 0, &mig), NVML_SUCCESS);
    CHECK_EQ(nvmlDeviceGetUUID(mig, buf, sizeof buf), NVML_SUCCESS);
    CHECK(!strcmp(buf, mig_uuid[1]));
    CHECK_EQ(nvmlDeviceGetMigDeviceHandleByIndex(gpu[1], 1, &d), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(mig_uuid[1], &d), NVML_SUCCESS);
    CHECK(d == mig);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(mig_uuid[0], &d), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetHandleByUUID(mig_uuid[2], &d), NVML_ERROR_NOT_FOUND);
    CHECK_EQ(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &d), NVML_SUCCESS);
    CHECK(d == gpu[1]);
    CHECK_EQ(nvmlShutdown(), NVML_SUCCESS);

    /* CUDA: the visible GPU, then the one visible MIG device. */
    int count = 0;
    CUdevice dev;
    CUuuid u;
    char name[128];
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGetCount(&count), CUDA_SUCCESS);
    CHECK_EQ(count, 2);
    CHECK_EQ(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGetPCIBusId(name, sizeof name, dev), CUDA_SUCCESS);
    CHECK(strcasecmp(name, bus0) != 0);
    CHECK_EQ(cuDeviceGet(&dev, 1), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGetName(name, sizeof name, dev), CUDA_SUCCESS);
    CHECK(!strcmp(name, "NVIDIA A100-SXM4-40GB MIG 1g.5gb"));
    CHECK_EQ(cuDeviceGetUuid(&u, dev), CUDA_SUCCESS);
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(buf, sizeof buf, "%02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
    CHECK(!strncmp(buf, mig_uuid[1] + 4, 8));
    CHECK_DONE();
}
