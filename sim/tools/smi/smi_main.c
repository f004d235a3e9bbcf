/* nvidia-smi of the simulated node: arguments, GPU selection, -L, --query-gpu,
 * --query-compute-apps, -mig, -r and the default table; `mig ...` is smi_mig.c. */
#define _GNU_SOURCE
#include "smi.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Noreturn void usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    exit(2);
}

_Noreturn void nvml_fail(nvmlReturn_t r)
{
    printf("%s\n", nvmlErrorString(r));
    exit((int)r);
}

static void shutdown_nvml(void)
{
    fflush(stdout);
    nvmlShutdown();
}

const char *take(char **args, int *n, const char *const *names)
{
    for (int k = 0; k < *n; k++)
        for (const char *const *nm = names; *nm; nm++) {
            size_t len = strlen(*nm);
            const char *value = NULL;
            int used = 0;
            if (!strcmp(args[k], *nm)) {
                if (k + 1 >= *n)
                    usage("Option %s requires a value.", *nm);
                value = args[k + 1];
                used = 2;
            } else if (!strncmp(*nm, "--", 2) && !strncmp(args[k], *nm, len) && args[k][len] == '=') {
                value = args[k] + len + 1;
                used = 1;
            }
            if (used) {
                memmove(&args[k], &args[k + used], (size_t)(*n - k - used) * sizeof *args);
                *n -= used;
                return value;
            }
        }
    return NULL;
}

int flag(char **args, int *n, const char *const *names)
{
    for (const char *const *nm = names; *nm; nm++)
        for (int k = 0; k < *n; k++)
            if (!strcmp(args[k], *nm)) {
                memmove(&args[k], &args[k + 1], (size_t)(*n - k - 1) * sizeof *args);
                *n -= 1;
                return 1;
            }
    return 0;
}

void id_list(const char *spec, unsigned *out, unsigned *n, unsigned max)
{
    *n = 0;
    for (const char *p = spec; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || (*end && *end != ',') || *n >= max)
            usage("Invalid instance ID list: %s", spec);
        out[(*n)++] = (unsigned)v;
        p = *end ? end + 1 : end;
    }
}

nvmlDevice_t handle(unsigned i)
{
    nvmlDevice_t d;
    NV(nvmlDeviceGetHandleByIndex_v2(i, &d));
    return d;
}

void bus_id(unsigned i, char *out, unsigned len)
{
    nvmlPciInfo_t pci;
    NV(nvmlDeviceGetPciInfo_v3(handle(i), &pci));
    snprintf(out, len, "%s", pci.busId);
}

int is_mig_enabled(unsigned i)
{
    unsigned cur = 0, pending = 0;
    return nvmlDeviceGetMigMode(handle(i), &cur, &pending) == NVML_SUCCESS && cur;
}

unsigned mig_handles(unsigned i, nvmlDevice_t *out)
{
    if (!is_mig_enabled(i))
        return 0;
    unsigned max = 0, n = 0;
    NV(nvmlDeviceGetMaxMigDeviceCount(handle(i), &max));
    while (n < max && n < SMI_MAX_ITEMS
           && nvmlDeviceGetMigDeviceHandleByIndex(handle(i), n, &out[n]) == NVML_SUCCESS)
        n++;
    return n;
}

static unsigned device_count(void)
{
    unsigned n = 0;
    NV(nvmlDeviceGetCount_v2(&n));
    return n > SMI_MAX_GPUS ? SMI_MAX_GPUS : n;
}

void select_devices(const char *spec, unsigned *gpus, unsigned *n)
{
    unsigned count = device_count();
    *n = 0;
    if (!spec) {
        for (unsigned i = 0; i < count; i++)
            gpus[(*n)++] = i;
        return;
    }
    char *copy = strdup(spec), *save = NULL;
    if (!copy)
        nvml_fail(NVML_ERROR_MEMORY);
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        item += strspn(item, " \t");
        item[strcspn(item, " \t")] = '\0';
        if (*item && strspn(item, "0123456789") == strlen(item)) {
            if (strtoul(item, NULL, 10) >= count)
                usage("Invalid GPU index: %s", item);
            if (*n < SMI_MAX_GPUS)
                gpus[(*n)++] = (unsigned)strtoul(item, NULL, 10);
            continue;
        }
        unsigned i = 0;
        for (; i < count; i++) {
            char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE], bus[32], upper[64];
            NV(nvmlDeviceGetUUID(handle(i), uuid, sizeof uuid));
            bus_id(i, bus, sizeof bus);
            size_t k = 0;
            for (; item[k] && k < sizeof upper - 1; k++)
                upper[k] = (char)(item[k] >= 'a' && item[k] <= 'z' ? item[k] - 32 : item[k]);
            upper[k] = '\0';
            size_t bl = strlen(bus), ul = strlen(upper);
            if (!strcmp(item, uuid) || !strcmp(item, bus) ||
                (ul <= bl && !strcmp(bus + bl - ul, upper)))
                break;
        }
        if (i == count)
            usage("No devices were found matching %s", item);
        if (*n < SMI_MAX_GPUS)
            gpus[(*n)++] = i;
    }
    free(copy);
}

/* ---- -L ----------------------------------------------------------------------------- */

static int list_gpus(void)
{
    unsigned count = device_count();
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t dev = handle(i);
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        NV(nvmlDeviceGetName(dev, name, sizeof name));
        NV(nvmlDeviceGetUUID(dev, uuid, sizeof uuid));
        printf("GPU %u: %s (UUID: %s)\n", i, name, uuid);
        nvmlDevice_t migs[SMI_MAX_ITEMS];
        unsigned nmig = mig_handles(i, migs);
        for (unsigned k = 0; k < nmig; k++) {
            nvmlDevice_t mig = migs[k];
            NV(nvmlDeviceGetName(mig, name, sizeof name));
            NV(nvmlDeviceGetUUID(mig, uuid, sizeof uuid));
            const char *profile = strstr(name, " MIG ");
            printf("  MIG %-12s Device %2u: (UUID: %s)\n", profile ? profile + 5 : name, k, uuid);
        }
    }
    return 0;
}

/* ---- --query-gpu, --query-compute-apps ---------------------------------------------- */

/* One field's value for GPU i, with its unit (*unit) and without. */
typedef void (*field_fn)(unsigned i, char *with_unit, char *bare, size_t len);

static void mode_of(unsigned i, int pending, char *out, size_t len)
{
    unsigned cur, pend;
    if (nvmlDeviceGetMigMode(handle(i), &cur, &pend) != NVML_SUCCESS)
        snprintf(out, len, "[N/A]");
    else
        snprintf(out, len, "%s", (pending ? pend : cur) ? "Enabled" : "Disabled");
}

#define FIELD(fname, ...)                                                                  \
    static void fname(unsigned i, char *u, char *b, size_t len)                            \
    {                                                                                      \
        (void)i;                                                                           \
        __VA_ARGS__;                                                                       \
        if (u != b)                                                                        \
            snprintf(u, len, "%s", b);                                                     \
    }
FIELD(f_index, snprintf(b, len, "%u", i))
FIELD(f_count, snprintf(b, len, "%u", device_count()))
FIELD(f_name, NV(nvmlDeviceGetName(handle(i), b, (unsigned)len)))
FIELD(f_uuid, NV(nvmlDeviceGetUUID(handle(i), b, (unsigned)len)))
FIELD(f_bus, bus_id(i, b, (unsigned)len))
FIELD(f_devid, nvmlPciInfo_t p; NV(nvmlDeviceGetPciInfo_v3(handle(i), &p));
      snprintf(b, len, "0x%08X", p.pciDeviceId))
FIELD(f_driver, NV(nvmlSystemGetDriverVersion(b, (unsigned)len)))
FIELD(f_mig_cur, mode_of(i, 0, b, len))
FIELD(f_mig_pend, mode_of(i, 1, b, len))
FIELD(f_cc, int ma, mi; NV(nvmlDeviceGetCudaComputeCapability(handle(i), &ma, &mi));
      snprintf(b, len, "%d.%d", ma, mi))

static void mem_field(unsigned i, char *u, char *b, size_t len, int what)
{
    nvmlMemory_t m;
    NV(nvmlDeviceGetMemoryInfo(handle(i), &m));
    unsigned long long v = (what == 0 ? m.total : what == 1 ? m.used : m.free) >> 20;
    snprintf(b, len, "%llu", v);
    snprintf(u, len, "%llu MiB", v);
}
static void f_total(unsigned i, char *u, char *b, size_t len) { mem_field(i, u, b, len, 0); }
static void f_used(unsigned i, char *u, char *b, size_t len) { mem_field(i, u, b, len, 1); }
static void f_free(unsigned i, char *u, char *b, size_t len) { mem_field(i, u, b, len, 2); }
static void f_util(unsigned i, char *u, char *b, size_t len)
{
    nvmlUtilization_t ut;
    if (nvmlDeviceGetUtilizationRates(handle(i), &ut) != NVML_SUCCESS) {
        snprintf(u, len, "[N/A]");
        snprintf(b, len, "[N/A]");
        return;
    }
    snprintf(u, len, "%u %%", ut.gpu);
    snprintf(b, len, "%u", ut.gpu);
}

static const struct {
    const char *name, *header;
    field_fn fn;
} GPU_FIELDS[] = {
    {"index", "index", f_index}, {"count", "count", f_count}, {"name", "name", f_name},
    {"gpu_name", "name", f_name}, {"uuid", "uuid", f_uuid}, {"gpu_uuid", "uuid", f_uuid},
    {"pci.bus_id", "pci.bus_id", f_bus}, {"gpu_bus_id", "pci.bus_id", f_bus},
    {"pci.device_id", "pci.device_id", f_devid}, {"driver_version", "driver_version", f_driver},
    {"memory.total", "memory.total [MiB]", f_total}, {"memory.used", "memory.used [MiB]", f_used},
    {"memory.free", "memory.free [MiB]", f_free}, {"utilization.gpu", "utilization.gpu [%]", f_util},
    {"mig.mode.current", "mig.mode.current", f_mig_cur},
    {"mig.mode.pending", "mig.mode.pending", f_mig_pend}, {"compute_cap", "compute_cap", f_cc},
};
#define NFIELDS (sizeof GPU_FIELDS / sizeof GPU_FIELDS[0])

static void parse_format(const char *fmt, int *noheader, int *nounits)
{
    if (!fmt)
        usage("\"--format=\" switch is missing. Please try again.");
    *noheader = *nounits = 0;
    int first = 1;
    char *copy = strdup(fmt), *save = NULL, *p;
    if (!copy)
        nvml_fail(NVML_ERROR_MEMORY);
    for (p = strtok_r(copy, ",", &save); p; p = strtok_r(NULL, ",", &save), first = 0) {
        if ((first && strcmp(p, "csv")) ||
            (strcmp(p, "csv") && strcmp(p, "noheader") && strcmp(p, "nounits")))
            usage(INVALID_ARGS);
        *noheader |= !strcmp(p, "noheader");
        *nounits |= !strcmp(p, "nounits");
    }
    if (first || fmt[0] == ',' || fmt[strlen(fmt) - 1] == ',' || strstr(fmt, ",,"))
        usage(INVALID_ARGS);
    free(copy);
}

/* Print a header field, without its " [unit]" under nounits. */
static void header_field(const char *h, int nounits, int first)
{
    const char *br = nounits ? strstr(h, " [") : NULL;
    printf("%s%.*s", first ? "" : ", ", br ? (int)(br - h) : (int)strlen(h), h);
}

/* The indexes in names[0..count) of the comma-separated fields (at most 64); exits naming
 * the first unknown one. */
static int field_list(const char *fields, const char *const *names, unsigned count, int *idx)
{
    int nf = 0;
    char *copy = strdup(fields), *save = NULL;
    if (!copy)
        nvml_fail(NVML_ERROR_MEMORY);
    for (char *f = strtok_r(copy, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
        f += strspn(f, " \t");
        f[strcspn(f, " \t")] = '\0';
        if (!*f)
            continue;
        unsigned k = 0;
        while (k < count && strcmp(names[k], f))
            k++;
        if (k == count)
            usage("Field \"%s\" is not a valid field to query.", f);
        if (nf < 64)
            idx[nf++] = (int)k;
    }
    free(copy);
    return nf;
}

static int query_gpu(const char *fields, const char *fmt, const unsigned *gpus, unsigned n)
{
    int noheader, nounits;
    parse_format(fmt, &noheader, &nounits);
    const char *names[NFIELDS];
    for (unsigned k = 0; k < NFIELDS; k++)
        names[k] = GPU_FIELDS[k].name;
    int idx[64], nf = field_list(fields, names, NFIELDS, idx);
    if (!noheader) {
        for (int k = 0; k < nf; k++)
            header_field(GPU_FIELDS[idx[k]].header, nounits, !k);
        putchar('\n');
    }
    for (unsigned g = 0; g < n; g++) {
        for (int k = 0; k < nf; k++) {
            char u[128], b[128];
            GPU_FIELDS[idx[k]].fn(gpus[g], u, b, sizeof b);
            printf("%s%s", k ? ", " : "", nounits ? b : u);
        }
        putchar('\n');
    }
    return 0;
}

static void proc_name(unsigned pid, char *out, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(out, 1, len - 1, f) : 0;
    if (f)
        fclose(f);
    out[n] = '\0';
    if (!out[0])
        snprintf(out, len, "[Not Found]");
}

static int query_apps(const char *fields, const char *fmt, const unsigned *gpus, unsigned n)
{
    static const char *const names[] = {"pid", "process_name", "name", "used_gpu_memory",
                                        "used_memory", "gpu_uuid", "gpu_bus_id", "gpu_name"};
    static const char *const headers[] = {"pid", "process_name", "process_name",
                                          "used_gpu_memory [MiB]", "used_gpu_memory [MiB]",
                                          "gpu_uuid", "gpu_bus_id", "gpu_name"};
    int noheader, nounits;
    parse_format(fmt, &noheader, &nounits);
    int idx[64], nf = field_list(fields, names, 8, idx);
    if (!noheader) {
        for (int k = 0; k < nf; k++)
            header_field(headers[idx[k]], nounits, !k);
        putchar('\n');
    }
    for (unsigned g = 0; g < n; g++) {
        nvmlDevice_t dev = handle(gpus[g]);
        nvmlProcessInfo_t procs[256];
        unsigned np = 256;
        NV(nvmlDeviceGetComputeRunningProcesses_v3(dev, &np, procs));
        for (unsigned p = 0; p < np; p++) {
            for (int k = 0; k < nf; k++) {
                char v[4096];
                switch (idx[k]) {
                case 0: snprintf(v, sizeof v, "%u", procs[p].pid); break;
                case 1: case 2: proc_name(procs[p].pid, v, sizeof v); break;
                case 3: case 4:
                    snprintf(v, sizeof v, "%llu%s", procs[p].usedGpuMemory >> 20,
                             nounits ? "" : " MiB");
                    break;
                case 5: NV(nvmlDeviceGetUUID(dev, v, sizeof v)); break;
                case 6: bus_id(gpus[g], v, sizeof v); break;
                default: NV(nvmlDeviceGetName(dev, v, sizeof v)); break;
                }
                printf("%s%s", k ? ", " : "", v);
            }
            putchar('\n');
        }
    }
    return 0;
}

/* ---- -mig, -r ----------------------------------------------------------------------- */

static int set_mig_mode(const unsigned *gpus, unsigned n, unsigned mode)
{
    int rc = 0;
    const char *word = mode ? "enable" : "disable";
    for (unsigned g = 0; g < n; g++) {
        char bus[32];
        bus_id(gpus[g], bus, sizeof bus);
        nvmlReturn_t status;
        nvmlReturn_t r = nvmlDeviceSetMigMode(handle(gpus[g]), mode, &status);
        if (r != NVML_SUCCESS) {
            printf("Unable to %s MIG Mode for GPU %s: %s\n", word, bus, nvmlErrorString(r));
            rc = r;
        } else if (status != NVML_SUCCESS) {
            printf("Warning: MIG mode is in pending %s state for GPU %s:%s\n", word, bus,
                   nvmlErrorString(status));
            printf("Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective "
                   "on GPU %s\n", bus);
        } else {
            printf("%s MIG Mode for GPU %s\n", mode ? "Enabled" : "Disabled", bus);
        }
    }
    printf("All done.\n");
    return rc;
}

/* The simulator's GPU reset, an entry point of its libnvidia-ml.so.1 (the real tool resets
 * through the driver). */
static int reset(const unsigned *gpus, unsigned n)
{
    int (*fn)(unsigned) = (int (*)(unsigned))dlsym(RTLD_DEFAULT, "tesseraSimResetGpu");
    if (!fn) {
        printf("GPU reset is not supported by this NVML library.\n");
        return NVML_ERROR_NOT_SUPPORTED;
    }
    int rc = 0;
    for (unsigned g = 0; g < n; g++) {
        char bus[32];
        bus_id(gpus[g], bus, sizeof bus);
        int r = fn(gpus[g]);
        if (r == NVML_ERROR_IN_USE) {
            printf("Unable to reset GPU %s because it's being used by some other process (e.g. "
                   "CUDA application, graphics application like X server, monitoring application "
                   "like other instance of nvidia-smi). Please first kill all processes using "
                   "this GPU and all compute applications running in the system.\n", bus);
            rc = r;
        } else if (r != 0) {
            printf("Unable to reset GPU %s: %s\n", bus, nvmlErrorString((nvmlReturn_t)r));
            rc = r;
        } else {
            printf("GPU %s was successfully reset.\n", bus);
        }
    }
    if (rc == 0)
        printf("All done.\n");
    return rc;
}

/* ---- main --------------------------------------------------------------------------- */

int smi_table(const unsigned *gpus, unsigned n);

static int run(int argc, char **args)
{
    if (argc > 0 && !strcmp(args[0], "mig"))
        return mig_command(argc - 1, args + 1);
    const char *gpu_spec = take(args, &argc, NAMES("-i", "--id"));
    unsigned gpus[SMI_MAX_GPUS], n;
    if (flag(args, &argc, NAMES("-L", "--list-gpus")))
        return list_gpus();
    const char *mig = take(args, &argc, NAMES("-mig", "--multi-instance-gpu"));
    if (mig) {
        if (strcmp(mig, "0") && strcmp(mig, "1"))
            usage("Invalid MIG mode: %s", mig);
        select_devices(gpu_spec, gpus, &n);
        return set_mig_mode(gpus, n, mig[0] == '1');
    }
    if (flag(args, &argc, NAMES("-r", "--gpu-reset"))) {
        if (!gpu_spec)
            usage("GPU reset requires -i.");
        select_devices(gpu_spec, gpus, &n);
        return reset(gpus, n);
    }
    const char *fmt = take(args, &argc, NAMES("--format"));
    const char *q = take(args, &argc, NAMES("--query-gpu"));
    if (q) {
        select_devices(gpu_spec, gpus, &n);
        return query_gpu(q, fmt, gpus, n);
    }
    q = take(args, &argc, NAMES("--query-compute-apps"));
    if (q) {
        select_devices(gpu_spec, gpus, &n);
        return query_apps(q, fmt, gpus, n);
    }
    if (argc == 0) {
        select_devices(gpu_spec, gpus, &n);
        return smi_table(gpus, n);
    }
    usage(INVALID_ARGS);
}

int main(int argc, char **argv)
{
    nvmlReturn_t r = nvmlInit_v2();
    if (r != NVML_SUCCESS) {
        printf("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n");
        return (int)r;
    }
    atexit(shutdown_nvml);
    return run(argc - 1, argv + 1);
}
