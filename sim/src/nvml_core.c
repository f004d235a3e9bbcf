/* Fake libnvidia-ml.so.1: the library itself -- its handles (one per GPU, GPU instance,
 * compute instance and MIG device, valid while what they name exists), nvmlInit/Shutdown,
 * error strings, the system queries and the simulator's fault control. */
#include "nvml_core.h"

#include <stdio.h>
#include <string.h>

struct nvmlDevice_st g_phys[SIM_MAX_GPUS];
struct nvmlDevice_st g_mig[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
struct nvmlGpuInstance_st g_gih[SIM_MAX_GPUS][SIM_MAX_GIS];
struct nvmlComputeInstance_st g_cih[SIM_MAX_GPUS][SIM_MAX_GIS][SIM_MAX_CIS];
int g_refs;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static nvmlReturn_t init(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refs == 0) {
        if (sim_attach() != 0) {
            fprintf(stderr, "tessera-sim libnvidia-ml: %s\n", sim_last_error());
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            int code = sim_fault("nvmlInit_v2");
            if (code)
                rc = (nvmlReturn_t)code;
        }
        if (rc == NVML_SUCCESS) {
            for (int g = 0; g < SIM_MAX_GPUS; g++) {
                g_phys[g] = (struct nvmlDevice_st){g, -1, -1};
                for (int i = 0; i < SIM_MAX_GIS; i++) {
                    g_gih[g][i] = (struct nvmlGpuInstance_st){g, i};
                    for (int c = 0; c < SIM_MAX_CIS; c++) {
                        g_mig[g][i][c] = (struct nvmlDevice_st){g, i, c};
                        g_cih[g][i][c] = (struct nvmlComputeInstance_st){g, i, c};
                    }
                }
            }
        }
    }
    if (rc == NVML_SUCCESS)
        g_refs++;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t rc = g_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0 && --g_refs == 0)
        sim_detach(); /* the next nvmlInit reads TESSERA_SIM_NODE again */
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
    ENTER();
    return copy_out(v, len, S()->driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len)
{
    ENTER();
    return copy_out(v, len, S()->nvml_version);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v)
{
    ENTER();
    if (!v)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = S()->cuda_driver_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT int tesseraSimSetFault(const char *fn, int count, int code, unsigned delay_us)
{
    if (sim_attach() != 0)
        return -1;
    return sim_fault_set(fn, count, code, delay_us);
}
