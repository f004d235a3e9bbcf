/* nvidia-smi of the simulated node, in C over NVML alone (smi_main.c, smi_mig.c): the real
 * tool's formats and exit codes for the commands tessera, its tests and users run (see
 * docs/mig.md, section 6).  Exit status: 0, the NVML error of a failure, 2 for bad usage. */
#ifndef SMI_H
#define SMI_H

#include <nvml.h>

#define SMI_MAX_GPUS 64
#define SMI_MAX_ITEMS 64 /* profiles, instances per GPU */
#define NAME_WIDTH 16
#define INVALID_ARGS "Invalid combination of input arguments. Please run \"nvidia-smi -h\" for help."

/* Print the message and exit 2 (bad usage). */
_Noreturn void usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print NVML's error string and exit with it. */
_Noreturn void nvml_fail(nvmlReturn_t r);
/* The call's result; an error: nvml_fail. */
#define NV(call)                                                                           \
    do {                                                                                   \
        nvmlReturn_t r_ = (call);                                                          \
        if (r_ != NVML_SUCCESS)                                                            \
            nvml_fail(r_);                                                                 \
    } while (0)

/* The GPUs a -i spec names (all without one), in *n; exits on a bad spec. */
void select_devices(const char *spec, unsigned *gpus, unsigned *n);
nvmlDevice_t handle(unsigned i);
/* The GPU's PCI bus id (00000000:17:00.0). */
void bus_id(unsigned i, char *out, unsigned len);
int is_mig_enabled(unsigned i);
/* GPU i's MIG devices in index order (none with MIG off), at most SMI_MAX_ITEMS; their number. */
unsigned mig_handles(unsigned i, nvmlDevice_t *out);

/* A GPU-instance profile: NVML's profile index, nvidia-smi's ID, the name without "MIG ". */
struct gi_profile {
    unsigned nvml_id, smi_id;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlGpuInstanceProfileInfo_v2_t info;
};
/* The GPU's profiles in nvidia-smi's order (small to large); their number. */
unsigned gi_profiles(nvmlDevice_t dev, struct gi_profile *out);

/* Remove `--name=value`, `--name value` or `-n value` (any of the NULL-terminated names) from
 * args[0..*n); the value, or NULL when absent. */
const char *take(char **args, int *n, const char *const *names);
/* Remove the first of the names present; whether one was. */
int flag(char **args, int *n, const char *const *names);
#define NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The comma-separated numbers of a -gi/-ci spec, in *n (at most max); exits on a bad one. */
void id_list(const char *spec, unsigned *out, unsigned *n, unsigned max);

/* mig subcommands (smi_mig.c): argv after "mig"; the exit status. */
int mig_command(int argc, char **argv);

#endif
