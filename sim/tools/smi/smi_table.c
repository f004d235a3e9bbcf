/* nvidia-smi with no command: the default table (the real tool's layout, 535 drivers): the
 * header with the driver and CUDA versions, one block per GPU (memory used / total as NVML
 * shows it: a budgeted container's budget under libtessera), the MIG devices, the
 * processes.  What the simulator does not model (fan, temperature, power) is N/A. */
#include "smi.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define W 89
#define GPU_RULE "+-----------------------------------------+----------------------+----------------------+"

static void line(const char *text)
{
    printf("|%-*s|\n", W - 2, text);
}

static void rule(char c)
{
    putchar('+');
    for (int k = 0; k < W - 2; k++)
        putchar(c);
    puts("+");
}

static void header(void)
{
    char drv[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE], text[256], cudav[32];
    int cuda = 0;
    NV(nvmlSystemGetDriverVersion(drv, sizeof drv));
    if (nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS)
        snprintf(cudav, sizeof cudav, "%d.%d", cuda / 1000, (cuda % 1000) / 10);
    else
        snprintf(cudav, sizeof cudav, "N/A");
    time_t now = time(NULL);
    char when[64];
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(when, sizeof when, "%a %b %e %H:%M:%S %Y", &tm))
        snprintf(when, sizeof when, "-");
    printf("%-30s\n", when);
    rule('-');
    snprintf(text, sizeof text, " NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-7s",
             drv, drv, cudav);
    line(text);
    puts("|-----------------------------------------+----------------------+----------------------+");
    puts("| GPU  Name                 Persistence-M | Bus-Id        Disp.A | Volatile Uncorr. ECC |");
    puts("| Fan  Temp   Perf          Pwr:Usage/Cap |         Memory-Usage | GPU-Util  Compute M. |");
    puts("|                                         |                      |               MIG M. |");
    puts("|=========================================+======================+======================|");
}

static void gpu_block(unsigned i)
{
    nvmlDevice_t dev = handle(i);
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], bus[32], mem[40], util[8], mig[16];
    NV(nvmlDeviceGetName(dev, name, sizeof name));
    bus_id(i, bus, sizeof bus);
    nvmlMemory_t m;
    NV(nvmlDeviceGetMemoryInfo(dev, &m));
    snprintf(mem, sizeof mem, "%lluMiB / %lluMiB", m.used >> 20, m.total >> 20);
    nvmlUtilization_t u;
    if (nvmlDeviceGetUtilizationRates(dev, &u) == NVML_SUCCESS)
        snprintf(util, sizeof util, "%u%%", u.gpu);
    else
        snprintf(util, sizeof util, "N/A");
    unsigned cur, pend;
    if (nvmlDeviceGetMigMode(dev, &cur, &pend) == NVML_SUCCESS)
        snprintf(mig, sizeof mig, "%s", cur ? "Enabled" : "Disabled");
    else
        snprintf(mig, sizeof mig, "N/A");
    printf("| %3u  %-29.29s  N/A | %-16.16s Off | %20s |\n", i, name, bus, "N/A");
    printf("| N/A   N/A    P0              N/A /  N/A | %20s | %7s      Default |\n", mem, util);
    printf("|                                         |                      | %20s |\n", mig);
    puts(GPU_RULE);
}

static unsigned mig_devices(const unsigned *gpus, unsigned n)
{
    unsigned rows = 0;
    for (unsigned g = 0; g < n; g++) {
        nvmlDevice_t migs[SMI_MAX_ITEMS];
        unsigned nmig = mig_handles(gpus[g], migs);
        for (unsigned k = 0; k < nmig; k++) {
            nvmlDevice_t mig = migs[k];
            if (!rows++) {
                puts("");
                rule('-');
                line(" MIG devices:");
                puts("+------------------+--------------------------------+-----------+-----------------------+");
                puts("| GPU  GI  CI  MIG |                   Memory-Usage |        Vol|      Shared           |");
                puts("|      ID  ID  Dev |                     BAR1-Usage | SM     Unc| CE ENC DEC OFA JPG    |");
                puts("|                  |                                |        ECC|                       |");
                puts("|==================+================================+===========+=======================|");
            }
            unsigned gi = 0, ci = 0;
            NV(nvmlDeviceGetGpuInstanceId(mig, &gi));
            NV(nvmlDeviceGetComputeInstanceId(mig, &ci));
            nvmlMemory_t m;
            NV(nvmlDeviceGetMemoryInfo(mig, &m));
            nvmlDeviceAttributes_t a;
            NV(nvmlDeviceGetAttributes_v2(mig, &a));
            char mem[40];
            snprintf(mem, sizeof mem, "%lluMiB / %lluMiB", m.used >> 20, m.total >> 20);
            printf("| %2u  %3u %3u %3u  | %30s | %3u    N/A| %2u %3u %4u %4u %4u |\n",
                   gpus[g], gi, ci, k, mem, a.multiprocessorCount, a.sharedCopyEngineCount,
                   a.sharedEncoderCount, a.sharedDecoderCount, a.sharedOfaCount,
                   a.sharedJpegCount);
            puts("+------------------+--------------------------------+-----------+-----------------------+");
        }
    }
    return rows;
}

static void processes(const unsigned *gpus, unsigned n)
{
    puts("");
    rule('-');
    line(" Processes:");
    line("  GPU   GI   CI        PID   Type   Process name                            GPU Memory");
    line("        ID   ID                                                             Usage     ");
    putchar('|');
    for (int k = 0; k < W - 2; k++)
        putchar('=');
    puts("|");
    unsigned shown = 0;
    for (unsigned g = 0; g < n; g++) {
        nvmlProcessInfo_t procs[256];
        unsigned np = 256;
        NV(nvmlDeviceGetComputeRunningProcesses_v3(handle(gpus[g]), &np, procs));
        for (unsigned p = 0; p < np; p++, shown++) {
            char gi[16] = "N/A", ci[16] = "N/A", pname[40] = "", path[64], mem[24];
            if (procs[p].gpuInstanceId != 0xFFFFFFFFu)
                snprintf(gi, sizeof gi, "%u", procs[p].gpuInstanceId);
            if (procs[p].computeInstanceId != 0xFFFFFFFFu)
                snprintf(ci, sizeof ci, "%u", procs[p].computeInstanceId);
            snprintf(path, sizeof path, "/proc/%u/cmdline", procs[p].pid);
            FILE *f = fopen(path, "rb");
            size_t len = f ? fread(pname, 1, sizeof pname - 1, f) : 0;
            if (f)
                fclose(f);
            pname[len] = '\0';
            snprintf(mem, sizeof mem, "%lluMiB", procs[p].usedGpuMemory >> 20);
            printf("|  %3u %4s %4s %10u %6s   %-38.38s %10s |\n", gpus[g], gi, ci, procs[p].pid,
                   "C", pname[0] ? pname : "[Not Found]", mem);
        }
    }
    if (!shown)
        line("  No running processes found");
    rule('-');
}

int smi_table(const unsigned *gpus, unsigned n)
{
    header();
    for (unsigned g = 0; g < n; g++)
        gpu_block(gpus[g]);
    mig_devices(gpus, n);
    processes(gpus, n);
    return 0;
}
