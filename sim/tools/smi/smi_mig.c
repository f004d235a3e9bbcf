/* nvidia-smi mig: list profiles and instances, create and destroy them (docs/mig.md 6.3-6.4),
 * the same NVML calls and output as the real tool. */
#include "smi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- instances ---------------------------------------------------------------------- */

struct gi_item {
    nvmlGpuInstance_t gi;
    nvmlGpuInstanceInfo_t info;
    struct gi_profile p;
};

struct ci_profile {
    unsigned nvml_id;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    nvmlComputeInstanceProfileInfo_v2_t info;
};

struct ci_item {
    nvmlComputeInstance_t ci;
    nvmlComputeInstanceInfo_t info;
    struct ci_profile p;
};

static void strip_mig(char *name)
{
    if (!strncmp(name, "MIG ", 4))
        memmove(name, name + 4, strlen(name + 4) + 1);
}

unsigned gi_profiles(nvmlDevice_t dev, struct gi_profile *out)
{
    unsigned n = 0;
    for (unsigned pid = 0; pid < NVML_GPU_INSTANCE_PROFILE_COUNT && n < SMI_MAX_ITEMS; pid++) {
        struct gi_profile p = {.nvml_id = pid};
        p.info.version = nvmlGpuInstanceProfileInfo_v2;
        nvmlReturn_t r = nvmlDeviceGetGpuInstanceProfileInfoV(dev, pid, &p.info);
        if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_INVALID_ARGUMENT)
            continue;
        NV(r);
        p.smi_id = p.info.id;
        snprintf(p.name, sizeof p.name, "%s", p.info.name);
        strip_mig(p.name);
        /* insertion, stable: by slices, memory, ID */
        unsigned k = n++;
        for (; k > 0; k--) {
            const nvmlGpuInstanceProfileInfo_v2_t *q = &out[k - 1].info;
            if (q->sliceCount < p.info.sliceCount ||
                (q->sliceCount == p.info.sliceCount &&
                 (q->memorySizeMB < p.info.memorySizeMB ||
                  (q->memorySizeMB == p.info.memorySizeMB && out[k - 1].smi_id <= p.smi_id))))
                break;
            out[k] = out[k - 1];
        }
        out[k] = p;
    }
    return n;
}

/* The GPU's GPU instances sorted by ID; those of `want` only (nwant > 0). */
static unsigned gpu_instances(nvmlDevice_t dev, const unsigned *want, unsigned nwant,
                              struct gi_item *out)
{
    struct gi_profile ps[SMI_MAX_ITEMS];
    unsigned np = gi_profiles(dev, ps), n = 0;
    for (unsigned k = 0; k < np; k++) {
        nvmlGpuInstance_t gis[8];
        unsigned count = 8;
        NV(nvmlDeviceGetGpuInstances(dev, ps[k].smi_id, gis, &count));
        for (unsigned j = 0; j < count && n < SMI_MAX_ITEMS; j++) {
            struct gi_item it = {.gi = gis[j], .p = ps[k]};
            NV(nvmlGpuInstanceGetInfo(gis[j], &it.info));
            int keep = nwant == 0;
            for (unsigned w = 0; w < nwant; w++)
                keep |= want[w] == it.info.id;
            if (!keep)
                continue;
            unsigned m = n++;
            for (; m > 0 && out[m - 1].info.id > it.info.id; m--)
                out[m] = out[m - 1];
            out[m] = it;
        }
    }
    return n;
}

static unsigned ci_profiles(nvmlGpuInstance_t gi, struct ci_profile *out)
{
    unsigned n = 0;
    for (unsigned pid = 0; pid < NVML_COMPUTE_INSTANCE_PROFILE_COUNT && n < SMI_MAX_ITEMS; pid++) {
        struct ci_profile p = {.nvml_id = pid};
        p.info.version = nvmlComputeInstanceProfileInfo_v2;
        nvmlReturn_t r = nvmlGpuInstanceGetComputeInstanceProfileInfoV(
            gi, pid, NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, &p.info);
        if (r == NVML_ERROR_NOT_SUPPORTED || r == NVML_ERROR_INVALID_ARGUMENT)
            continue;
        NV(r);
        snprintf(p.name, sizeof p.name, "%s", p.info.name);
        strip_mig(p.name);
        out[n++] = p;
    }
    return n;
}

static unsigned compute_instances(nvmlGpuInstance_t gi, struct ci_item *out)
{
    struct ci_profile ps[SMI_MAX_ITEMS];
    unsigned np = ci_profiles(gi, ps), n = 0;
    for (unsigned k = 0; k < np; k++) {
        nvmlComputeInstance_t cis[8];
        unsigned count = 8;
        NV(nvmlGpuInstanceGetComputeInstances(gi, ps[k].nvml_id, cis, &count));
        for (unsigned j = 0; j < count && n < SMI_MAX_ITEMS; j++) {
            struct ci_item it = {.ci = cis[j], .p = ps[k]};
            NV(nvmlComputeInstanceGetInfo(cis[j], &it.info));
            unsigned m = n++;
            for (; m > 0 && out[m - 1].info.id > it.info.id; m--)
                out[m] = out[m - 1];
            out[m] = it;
        }
    }
    return n;
}

/* ---- boxes -------------------------------------------------------------------------- */

static void rule(char c, int width, char end)
{
    putchar(end);
    for (int k = 0; k < width - 2; k++)
        putchar(c);
    printf("%c\n", end);
}

static void box_top(const char *title, const char *const *header, int width)
{
    rule('-', width, '+');
    printf("| %-*s|\n", width - 3, title);
    for (; *header; header++)
        printf("|%-*s|\n", width - 2, *header);
    rule('=', width, '|');
}

static void row(const char *text, int width)
{
    printf("|%-*s|\n", width - 2, text);
}

/* ---- listing ------------------------------------------------------------------------ */

static int mig_lgip(const unsigned *gpus, unsigned ngpu)
{
    static char rows[SMI_MAX_GPUS * 8][2][320];
    unsigned nrows = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        if (!is_mig_enabled(gpus[g]))
            continue;
        nvmlDevice_t dev = handle(gpus[g]);
        struct gi_profile ps[SMI_MAX_ITEMS];
        unsigned np = gi_profiles(dev, ps);
        for (unsigned k = 0; k < np && nrows < SMI_MAX_GPUS * 8; k++) {
            const nvmlGpuInstanceProfileInfo_v2_t *in = &ps[k].info;
            unsigned free_ = 0;
            NV(nvmlDeviceGetGpuInstanceRemainingCapacity(dev, ps[k].smi_id, &free_));
            char name[80], ft[32], gib[32];
            snprintf(name, sizeof name, "MIG %s", ps[k].name);
            snprintf(ft, sizeof ft, "%u/%u", free_, in->instanceCount);
            snprintf(gib, sizeof gib, "%.2f", in->memorySizeMB / 1024.0);
            snprintf(rows[nrows][0], sizeof rows[0][0], "%4u  %-*s%4u%8s%12s%9s%7u%6u%6u   ",
                     gpus[g], NAME_WIDTH, name, ps[k].smi_id, ft, gib,
                     in->isP2pSupported ? "Yes" : "No", in->multiprocessorCount,
                     in->decoderCount, in->encoderCount);
            snprintf(rows[nrows][1], sizeof rows[0][1], "%55s%7u%6u%6u   ", "",
                     in->copyEngineCount, in->jpegCount, in->ofaCount);
            nrows++;
        }
    }
    if (!nrows) {
        printf("No MIG-enabled devices found.\n");
        return 0;
    }
    box_top("GPU instance profiles:",
            NAMES(" GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  ",
                  "                              Free/Total   GiB              CE    JPEG  OFA  "),
            79);
    for (unsigned k = 0; k < nrows; k++) {
        row(rows[k][0], 79);
        row(rows[k][1], 79);
        rule('-', 79, '+');
    }
    return 0;
}

static int mig_lgipp(const unsigned *gpus, unsigned ngpu)
{
    for (unsigned g = 0; g < ngpu; g++) {
        if (!is_mig_enabled(gpus[g]))
            continue;
        nvmlDevice_t dev = handle(gpus[g]);
        struct gi_profile ps[SMI_MAX_ITEMS];
        unsigned np = gi_profiles(dev, ps);
        for (unsigned k = 0; k < np; k++) {
            nvmlGpuInstancePlacement_t pl[8];
            unsigned count = 8;
            NV(nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, ps[k].smi_id, pl, &count));
            printf("GPU %2u Profile ID %2u %s {", gpus[g], ps[k].smi_id,
                   count > 1 ? "Placements:" : "Placement :");
            for (unsigned j = 0; j < count; j++)
                printf(j ? ",%u" : "%u", pl[j].start);
            printf("}:%u\n", count ? pl[0].size : 0);
        }
    }
    return 0;
}

static int mig_lgi(const unsigned *gpus, unsigned ngpu, const unsigned *want, unsigned nwant)
{
    static char rows[SMI_MAX_GPUS * 8][320];
    unsigned nrows = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        if (!is_mig_enabled(gpus[g]))
            continue;
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), want, nwant, gis);
        for (unsigned k = 0; k < n && nrows < SMI_MAX_GPUS * 8; k++) {
            char name[80], place[32];
            snprintf(name, sizeof name, "MIG %s", gis[k].p.name);
            snprintf(place, sizeof place, "%u:%u", gis[k].info.placement.start,
                     gis[k].info.placement.size);
            snprintf(rows[nrows++], sizeof rows[0], "%4u  %-*s%6u%9u%13s     ", gpus[g],
                     NAME_WIDTH, name, gis[k].p.smi_id, gis[k].info.id, place);
        }
    }
    if (!nrows) {
        printf("No GPU instances found: Not Found\n");
        return NVML_ERROR_NOT_FOUND;
    }
    box_top("GPU instances:",
            NAMES(" GPU   Name             Profile  Instance   Placement  ",
                  "                          ID       ID       Start:Size "),
            57);
    for (unsigned k = 0; k < nrows; k++)
        row(rows[k], 57);
    rule('-', 57, '+');
    return 0;
}

static int mig_lci(const unsigned *gpus, unsigned ngpu, const unsigned *gw, unsigned ngw,
                   const unsigned *cw, unsigned ncw, int ci_given)
{
    static char rows[SMI_MAX_GPUS * 8 * 8][320];
    unsigned nrows = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        if (!is_mig_enabled(gpus[g]))
            continue;
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), gw, ngw, gis);
        for (unsigned k = 0; k < n; k++) {
            struct ci_item cis[SMI_MAX_ITEMS];
            unsigned m = compute_instances(gis[k].gi, cis);
            for (unsigned j = 0; j < m && nrows < sizeof rows / sizeof rows[0]; j++) {
                int keep = !ci_given;
                for (unsigned w = 0; w < ncw; w++)
                    keep |= cw[w] == cis[j].info.id;
                if (!keep)
                    continue;
                char name[80], place[32];
                snprintf(name, sizeof name, "MIG %s", cis[j].p.name);
                snprintf(place, sizeof place, "%u:%u", cis[j].info.placement.start,
                         cis[j].info.placement.size);
                snprintf(rows[nrows++], sizeof rows[0], "%4u%7u       %-*s%6u%10u%13s     ",
                         gpus[g], gis[k].info.id, NAME_WIDTH, name, cis[j].p.nvml_id,
                         cis[j].info.id, place);
            }
        }
    }
    if (!nrows) {
        printf("No compute instances found: Not Found\n");
        return NVML_ERROR_NOT_FOUND;
    }
    box_top("Compute instances:",
            NAMES(" GPU     GPU       Name             Profile   Instance   Placement  ",
                  "       Instance                       ID        ID       Start:Size ",
                  "         ID                                                         "),
            70);
    for (unsigned k = 0; k < nrows; k++)
        row(rows[k], 70);
    rule('-', 70, '+');
    return 0;
}

static int mig_lcip(const unsigned *gpus, unsigned ngpu, const unsigned *gw, unsigned ngw)
{
    static char rows[SMI_MAX_GPUS * 8 * 8][2][320];
    unsigned nrows = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        if (!is_mig_enabled(gpus[g]))
            continue;
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), gw, ngw, gis);
        for (unsigned k = 0; k < n; k++) {
            struct ci_profile ps[SMI_MAX_ITEMS];
            unsigned np = ci_profiles(gis[k].gi, ps);
            for (unsigned j = 0; j < np && nrows < sizeof rows / sizeof rows[0]; j++) {
                const nvmlComputeInstanceProfileInfo_v2_t *in = &ps[j].info;
                unsigned free_ = 0;
                NV(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(gis[k].gi, ps[j].nvml_id,
                                                                      &free_));
                char name[80], ft[32];
                snprintf(name, sizeof name, "MIG %s", ps[j].name);
                snprintf(ft, sizeof ft, "%u/%u", free_, in->instanceCount);
                snprintf(rows[nrows][0], sizeof rows[0][0],
                         "%4u%7u       %-*s%6u%c%9s%13u%9u%6u%6u   ", gpus[g], gis[k].info.id,
                         NAME_WIDTH, name, ps[j].nvml_id,
                         in->sliceCount == gis[k].p.info.sliceCount ? '*' : ' ', ft,
                         in->multiprocessorCount, in->sharedDecoderCount,
                         in->sharedEncoderCount, in->sharedOfaCount);
                snprintf(rows[nrows][1], sizeof rows[0][1], "%62s%7u%6u%9s", "",
                         in->sharedCopyEngineCount, in->sharedJpegCount, "");
                nrows++;
            }
        }
    }
    if (!nrows) {
        printf("No GPU instances found: Not Found\n");
        return NVML_ERROR_NOT_FOUND;
    }
    box_top("Compute instance profiles:",
            NAMES(" GPU     GPU       Name             Profile  Instances   Exclusive       Shared         ",
                  "       Instance                       ID     Free/Total     SM       DEC   ENC   OFA  ",
                  "         ID                                                          CE    JPEG       "),
            88);
    for (unsigned k = 0; k < nrows; k++) {
        row(rows[k][0], 88);
        row(rows[k][1], 88);
        rule('-', 88, '+');
    }
    return 0;
}

/* ---- creating and destroying -------------------------------------------------------- */

/* "name[:start]": the name, and the start (-1: none). */
static void split_placement(const char *token, char *name, size_t len, long *start)
{
    snprintf(name, len, "%s", token);
    *start = -1;
    char *colon = strrchr(name, ':');
    if (colon && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1)) {
        *start = strtol(colon + 1, NULL, 10);
        *colon = '\0';
    }
}

static int is_number(const char *s)
{
    return *s && strspn(s, "0123456789") == strlen(s);
}

static const char *without_mig(const char *s)
{
    return strncmp(s, "MIG ", 4) ? s : s + 4;
}

static int default_ci(nvmlGpuInstance_t gi, const struct gi_profile *gp, struct ci_profile *out)
{
    struct ci_profile ps[SMI_MAX_ITEMS];
    unsigned np = ci_profiles(gi, ps);
    for (unsigned k = 0; k < np; k++)
        if (ps[k].info.sliceCount == gp->info.sliceCount) {
            *out = ps[k];
            return 0;
        }
    usage("no default compute instance profile");
}

static int ci_create_failed(unsigned gpu, unsigned gi_id, const char *profile, nvmlReturn_t r)
{
    printf("Unable to create a compute instance on GPU %2u GPU instance ID %2u using profile "
           "%s: %s\n", gpu, gi_id, profile, nvmlErrorString(r));
    printf("Failed to create compute instances: %s\n", nvmlErrorString(r));
    return r;
}

static nvmlReturn_t create_ci(unsigned gpu, nvmlGpuInstance_t gi, unsigned gi_id,
                              const struct ci_profile *cp, long start)
{
    nvmlComputeInstance_t ci;
    nvmlReturn_t r;
    if (start < 0) {
        r = nvmlGpuInstanceCreateComputeInstance(gi, cp->nvml_id, &ci);
    } else {
        nvmlComputeInstancePlacement_t pl = {.start = (unsigned)start, .size = cp->info.sliceCount};
        r = nvmlGpuInstanceCreateComputeInstanceWithPlacement(gi, cp->nvml_id, &pl, &ci);
    }
    if (r != NVML_SUCCESS)
        return r;
    nvmlComputeInstanceInfo_t info;
    NV(nvmlComputeInstanceGetInfo(ci, &info));
    printf("Successfully created compute instance ID %2u on GPU %2u GPU instance ID %2u using "
           "profile MIG %s (ID %2u)\n", info.id, gpu, gi_id, cp->name, cp->nvml_id);
    return NVML_SUCCESS;
}

static int mig_cgi(const unsigned *gpus, unsigned ngpu, const char *spec, int with_ci)
{
    for (unsigned g = 0; g < ngpu; g++) {
        nvmlDevice_t dev = handle(gpus[g]);
        char *copy = strdup(spec), *save = NULL;
        if (!copy)
            nvml_fail(NVML_ERROR_MEMORY);
        for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            tok += strspn(tok, " \t");
            if (!*tok)
                continue;
            char want[128];
            long start;
            split_placement(tok, want, sizeof want, &start);
            struct gi_profile ps[SMI_MAX_ITEMS], *p = NULL;
            unsigned np = gi_profiles(dev, ps);
            for (unsigned k = 0; k < np && !p; k++)
                if ((is_number(want) && ps[k].smi_id == strtoul(want, NULL, 10)) ||
                    !strcmp(without_mig(want), ps[k].name))
                    p = &ps[k];
            if (!p)
                usage("Invalid GPU instance profile: %s", want);
            nvmlGpuInstance_t gi;
            nvmlReturn_t r;
            if (start < 0) {
                r = nvmlDeviceCreateGpuInstance(dev, p->smi_id, &gi);
            } else {
                nvmlGpuInstancePlacement_t pls[8];
                unsigned count = 8;
                NV(nvmlDeviceGetGpuInstancePossiblePlacements_v2(dev, p->smi_id, pls, &count));
                if (!count)
                    nvml_fail(NVML_ERROR_UNKNOWN); /* the Python tool's IndexError */
                nvmlGpuInstancePlacement_t pl = {.start = (unsigned)start, .size = pls[0].size};
                r = nvmlDeviceCreateGpuInstanceWithPlacement(dev, p->smi_id, &pl, &gi);
            }
            if (r != NVML_SUCCESS) {
                printf("Unable to create a GPU instance on GPU %2u using profile %s: %s\n",
                       gpus[g], want, nvmlErrorString(r));
                printf("Failed to create GPU instances: %s\n", nvmlErrorString(r));
                free(copy);
                return r;
            }
            nvmlGpuInstanceInfo_t info;
            NV(nvmlGpuInstanceGetInfo(gi, &info));
            printf("Successfully created GPU instance ID %2u on GPU %2u using profile MIG %s "
                   "(ID %2u)\n", info.id, gpus[g], p->name, p->smi_id);
            if (with_ci) {
                struct ci_profile cp;
                default_ci(gi, p, &cp);
                r = create_ci(gpus[g], gi, info.id, &cp, -1);
                if (r != NVML_SUCCESS) {
                    free(copy);
                    return ci_create_failed(gpus[g], info.id, p->name, r);
                }
            }
        }
        free(copy);
    }
    return 0;
}

static int mig_cci(const unsigned *gpus, unsigned ngpu, const char *spec, const unsigned *gw,
                   unsigned ngw)
{
    for (unsigned g = 0; g < ngpu; g++) {
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), gw, ngw, gis);
        for (unsigned k = 0; k < n; k++) {
            char *copy = strdup(spec ? spec : ""), *save = NULL;
            if (!copy)
                nvml_fail(NVML_ERROR_MEMORY);
            /* no spec: one empty token, the default profile */
            char *tok = spec ? strtok_r(copy, ",", &save) : copy;
            for (; tok; tok = spec ? strtok_r(NULL, ",", &save) : NULL) {
                tok += strspn(tok, " \t");
                char want[128];
                long start;
                split_placement(tok, want, sizeof want, &start);
                struct ci_profile cp;
                if (!*want) {
                    default_ci(gis[k].gi, &gis[k].p, &cp);
                } else {
                    struct ci_profile ps[SMI_MAX_ITEMS];
                    unsigned np = ci_profiles(gis[k].gi, ps), j = 0;
                    for (; j < np; j++)
                        if ((is_number(want) && ps[j].nvml_id == strtoul(want, NULL, 10)) ||
                            !strcmp(without_mig(want), ps[j].name))
                            break;
                    if (j == np)
                        usage("Invalid compute instance profile: %s", want);
                    cp = ps[j];
                }
                nvmlReturn_t r = create_ci(gpus[g], gis[k].gi, gis[k].info.id, &cp, start);
                if (r != NVML_SUCCESS) {
                    free(copy);
                    return ci_create_failed(gpus[g], gis[k].info.id, *want ? want : cp.name, r);
                }
            }
            free(copy);
        }
    }
    return 0;
}

static int mig_dci(const unsigned *gpus, unsigned ngpu, const unsigned *gw, unsigned ngw,
                   const unsigned *cw, unsigned ncw, int ci_given)
{
    int found = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), gw, ngw, gis);
        for (unsigned k = 0; k < n; k++) {
            struct ci_item cis[SMI_MAX_ITEMS];
            unsigned m = compute_instances(gis[k].gi, cis);
            for (unsigned j = 0; j < m; j++) {
                int keep = !ci_given;
                for (unsigned w = 0; w < ncw; w++)
                    keep |= cw[w] == cis[j].info.id;
                if (!keep)
                    continue;
                found = 1;
                nvmlReturn_t r = nvmlComputeInstanceDestroy(cis[j].ci);
                if (r != NVML_SUCCESS) {
                    printf("Unable to destroy compute instance ID %2u from GPU %2u GPU instance "
                           "ID %2u: %s\n", cis[j].info.id, gpus[g], gis[k].info.id,
                           nvmlErrorString(r));
                    printf("Failed to destroy compute instances: %s\n", nvmlErrorString(r));
                    return r;
                }
                printf("Successfully destroyed compute instance ID %2u from GPU %2u GPU instance "
                       "ID %2u\n", cis[j].info.id, gpus[g], gis[k].info.id);
            }
        }
    }
    if (!found) {
        printf("No compute instances found: Not Found\n");
        return NVML_ERROR_NOT_FOUND;
    }
    return 0;
}

static int mig_dgi(const unsigned *gpus, unsigned ngpu, const unsigned *gw, unsigned ngw)
{
    int found = 0;
    for (unsigned g = 0; g < ngpu; g++) {
        struct gi_item gis[SMI_MAX_ITEMS];
        unsigned n = gpu_instances(handle(gpus[g]), gw, ngw, gis);
        for (unsigned k = 0; k < n; k++) {
            found = 1;
            nvmlReturn_t r = nvmlGpuInstanceDestroy(gis[k].gi);
            if (r != NVML_SUCCESS) {
                printf("Unable to destroy GPU instance ID %2u from GPU %2u: %s\n",
                       gis[k].info.id, gpus[g], nvmlErrorString(r));
                printf("Failed to destroy GPU instances: %s\n", nvmlErrorString(r));
                return r;
            }
            printf("Successfully destroyed GPU instance ID %2u from GPU %2u\n", gis[k].info.id,
                   gpus[g]);
        }
    }
    if (!found) {
        printf("No GPU instances found: Not Found\n");
        return NVML_ERROR_NOT_FOUND;
    }
    return 0;
}

/* ---- nvidia-smi mig ... ------------------------------------------------------------- */

int mig_command(int argc, char **args)
{
    const char *gpu_spec = take(args, &argc, NAMES("-i", "--id"));
    const char *gi_spec = take(args, &argc, NAMES("-gi", "--gpu-instance-id"));
    const char *ci_spec = take(args, &argc, NAMES("-ci", "--compute-instance-id"));
    unsigned gpus[SMI_MAX_GPUS], ngpu, gw[SMI_MAX_ITEMS], ngw = 0, cw[SMI_MAX_ITEMS], ncw = 0;
    select_devices(gpu_spec, gpus, &ngpu);
    if (gi_spec)
        id_list(gi_spec, gw, &ngw, SMI_MAX_ITEMS);
    if (ci_spec)
        id_list(ci_spec, cw, &ncw, SMI_MAX_ITEMS);
    if (flag(args, &argc, NAMES("-lgip", "--list-gpu-instance-profiles")))
        return mig_lgip(gpus, ngpu);
    if (flag(args, &argc, NAMES("-lgipp", "--list-gpu-instance-possible-placements")))
        return mig_lgipp(gpus, ngpu);
    if (flag(args, &argc, NAMES("-lgi", "--list-gpu-instances")))
        return mig_lgi(gpus, ngpu, gw, ngw);
    if (flag(args, &argc, NAMES("-lcip", "--list-compute-instance-profiles")))
        return mig_lcip(gpus, ngpu, gw, ngw);
    if (flag(args, &argc, NAMES("-lci", "--list-compute-instances")))
        return mig_lci(gpus, ngpu, gw, ngw, cw, ncw, ci_spec != NULL);
    const char *cgi = take(args, &argc, NAMES("-cgi", "--create-gpu-instance"));
    if (cgi)
        return mig_cgi(gpus, ngpu, cgi, flag(args, &argc, NAMES("-C", "--default-compute-instance")));
    for (int k = 0; k < argc; k++)
        if (!strcmp(args[k], "-cci") || !strcmp(args[k], "--create-compute-instance")) {
            const char *spec = k + 1 < argc && args[k + 1][0] != '-' ? args[k + 1] : NULL;
            return mig_cci(gpus, ngpu, spec, gw, ngw);
        }
    if (flag(args, &argc, NAMES("-dci", "--destroy-compute-instance")))
        return mig_dci(gpus, ngpu, gw, ngw, cw, ncw, ci_spec != NULL);
    if (flag(args, &argc, NAMES("-dgi", "--destroy-gpu-instance")))
        return mig_dgi(gpus, ngpu, gw, ngw);
    usage("Invalid combination of input arguments. Please run \"nvidia-smi mig -h\" for help.");
}
