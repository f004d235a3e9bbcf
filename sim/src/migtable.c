/* MIG profile tables (MIG User Guide, real nvidia-smi -lgip/-lgipp outputs; see
 * docs/mig.md §1.2-1.4). Memory in MiB as NVML reports it; the H100-80GB and H200 memory
 * was read from NVML (nvmlDeviceGetGpuInstanceProfileInfo) on real GPUs, driver 580.159.04,
 * 2026-11-27.  Where no real output is known (H100-96GB, B200 memory; B200 SMs) the figures
 * are proportional (slices x device / total), the same rule the planner's catalog uses. */
#include "migtable.h"

#include <nvml.h>
#include <string.h>

#define S1 {0, 1, 2, 3, 4, 5, 6}
#define S_DOUBLE {0, 2, 4, 6}
#define S2 {0, 2, 4}
#define S3 {0, 4}
#define S0 {0}
#define S4_1 {0, 1, 2, 3}
#define S4_2 {0, 2}

/* Fields: name, nvml id, smi id, mem slices, compute slices, max, nstarts, starts, MiB, SMs,
 * CE, DEC, ENC, JPEG, OFA. */
#define P8(name, nv, smi, ms, cs, max, ns, st, mib, sm, ce, dec, jpeg, ofa) \
    {name, nv, smi, ms, cs, max, ns, st, mib, sm, ce, dec, 0, jpeg, ofa}

#define ONE NVML_GPU_INSTANCE_PROFILE_1_SLICE
#define ONE_ME NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
#define ONE_DBL NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2
#define TWO NVML_GPU_INSTANCE_PROFILE_2_SLICE
#define TWO_ME NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1
#define THREE NVML_GPU_INSTANCE_PROFILE_3_SLICE
#define FOUR NVML_GPU_INSTANCE_PROFILE_4_SLICE
#define SEVEN NVML_GPU_INSTANCE_PROFILE_7_SLICE

static const struct sim_mig_profile a100_40[] = {
    P8("1g.5gb", ONE, 19, 1, 1, 7, 7, S1, 4864, 14, 1, 0, 0, 0),
    P8("1g.5gb+me", ONE_ME, 20, 1, 1, 1, 7, S1, 4864, 14, 1, 1, 1, 1),
    P8("1g.10gb", ONE_DBL, 15, 2, 1, 4, 4, S_DOUBLE, 9984, 14, 1, 1, 0, 0),
    P8("2g.10gb", TWO, 14, 2, 2, 3, 3, S2, 9984, 28, 2, 1, 0, 0),
    P8("3g.20gb", THREE, 9, 4, 3, 2, 2, S3, 20096, 42, 3, 2, 0, 0),
    P8("4g.20gb", FOUR, 5, 4, 4, 1, 1, S0, 20096, 56, 4, 2, 0, 0),
    P8("7g.40gb", SEVEN, 0, 8, 7, 1, 1, S0, 40448, 98, 7, 5, 1, 1),
};

static const struct sim_mig_profile a100_80[] = {
    P8("1g.10gb", ONE, 19, 1, 1, 7, 7, S1, 9728, 14, 1, 0, 0, 0),
    P8("1g.10gb+me", ONE_ME, 20, 1, 1, 1, 7, S1, 9728, 14, 1, 1, 1, 1),
    P8("1g.20gb", ONE_DBL, 15, 2, 1, 4, 4, S_DOUBLE, 19968, 14, 1, 1, 0, 0),
    P8("2g.20gb", TWO, 14, 2, 2, 3, 3, S2, 19968, 28, 2, 1, 0, 0),
    P8("3g.40gb", THREE, 9, 4, 3, 2, 2, S3, 40192, 42, 3, 2, 0, 0),
    P8("4g.40gb", FOUR, 5, 4, 4, 1, 1, S0, 40192, 56, 4, 2, 0, 0),
    P8("7g.80gb", SEVEN, 0, 8, 7, 1, 1, S0, 81920, 98, 7, 5, 1, 1),
};

static const struct sim_mig_profile a30[] = {
    P8("1g.6gb", ONE, 14, 1, 1, 4, 4, S4_1, 5952, 14, 1, 1, 0, 0),
    P8("1g.6gb+me", ONE_ME, 21, 1, 1, 1, 4, S4_1, 5952, 14, 1, 1, 1, 1),
    P8("2g.12gb", TWO, 5, 2, 2, 2, 2, S4_2, 11968, 28, 2, 2, 0, 0),
    P8("2g.12gb+me", TWO_ME, 6, 2, 2, 1, 2, S4_2, 11968, 28, 2, 2, 1, 1),
    P8("4g.24gb", FOUR, 0, 4, 4, 1, 1, S0, 24064, 56, 4, 4, 1, 1),
};

#define HOPPER(n1, n1me, n1d, n2, n3, n4, n7, m1, m2, m4, m8)                  \
    {                                                                          \
        P8(n1, ONE, 19, 1, 1, 7, 7, S1, m1, 16, 1, 1, 1, 0),                   \
        P8(n1me, ONE_ME, 20, 1, 1, 1, 7, S1, m1, 16, 1, 1, 1, 1),              \
        P8(n1d, ONE_DBL, 15, 2, 1, 4, 4, S_DOUBLE, m2, 26, 1, 1, 1, 0),        \
        P8(n2, TWO, 14, 2, 2, 3, 3, S2, m2, 32, 2, 2, 2, 0),                   \
        P8(n3, THREE, 9, 4, 3, 2, 2, S3, m4, 60, 3, 3, 3, 0),                  \
        P8(n4, FOUR, 5, 4, 4, 1, 1, S0, m4, 64, 4, 4, 4, 0),                   \
        P8(n7, SEVEN, 0, 8, 7, 1, 1, S0, m8, 132, 8, 7, 7, 1),                 \
    }

static const struct sim_mig_profile h100_80[] = HOPPER(
    "1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    9984, 20096, 40448, 81152);
static const struct sim_mig_profile h100_94[] = HOPPER(
    "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    11008, 22144, 47488, 95360);
static const struct sim_mig_profile h100_96[] = HOPPER(
    "1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
    12233, 24467, 48935, 97871);
static const struct sim_mig_profile h200_141[] = HOPPER(
    "1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    16384, 33280, 71424, 143360);

static const struct sim_mig_profile b200_180[] = {
    P8("1g.23gb", ONE, 19, 1, 1, 7, 7, S1, 22919, 21, 2, 1, 1, 0),
    P8("1g.23gb+me", ONE_ME, 20, 1, 1, 1, 7, S1, 22919, 21, 2, 1, 1, 1),
    P8("1g.45gb", ONE_DBL, 15, 2, 1, 4, 4, S_DOUBLE, 45839, 21, 2, 1, 1, 0),
    P8("2g.45gb", TWO, 14, 2, 2, 3, 3, S2, 45839, 42, 3, 1, 1, 0),
    P8("3g.90gb", THREE, 9, 4, 3, 2, 2, S3, 91679, 63, 6, 1, 1, 0),
    P8("4g.90gb", FOUR, 5, 4, 4, 1, 1, S0, 91679, 84, 8, 1, 1, 0),
    P8("7g.180gb", SEVEN, 0, 8, 7, 1, 1, S0, 183359, 148, 16, 1, 1, 1),
};

#define N(a) (uint32_t)(sizeof(a) / sizeof((a)[0]))

static const struct sim_mig_table tables[] = {
    {"A100-40GB", 8, 7, a100_40, N(a100_40)},
    {"A100-80GB", 8, 7, a100_80, N(a100_80)},
    {"A30-24GB", 4, 4, a30, N(a30)},
    {"H100-80GB", 8, 7, h100_80, N(h100_80)},
    {"H100-94GB", 8, 7, h100_94, N(h100_94)},
    {"H100-96GB", 8, 7, h100_96, N(h100_96)},
    {"H200-141GB", 8, 7, h200_141, N(h200_141)},
    {"B200-180GB", 8, 7, b200_180, N(b200_180)},
};

int sim_mig_table_for(const char *model_id)
{
    for (uint32_t i = 0; i < N(tables); i++)
        if (strcmp(tables[i].model_id, model_id) == 0)
            return (int)i;
    return -1;
}

const struct sim_mig_table *sim_mig_table(int table)
{
    if (table < 0 || (uint32_t)table >= N(tables))
        return NULL;
    return &tables[table];
}

const struct sim_mig_profile *sim_mig_profile(int table, int profile)
{
    const struct sim_mig_table *t = sim_mig_table(table);
    if (!t || profile < 0 || (uint32_t)profile >= t->nprofiles)
        return NULL;
    return &t->profiles[profile];
}

int sim_mig_profile_by_nvml_id(int table, uint32_t nvml_id)
{
    const struct sim_mig_table *t = sim_mig_table(table);
    if (!t)
        return -1;
    for (uint32_t i = 0; i < t->nprofiles; i++)
        if (t->profiles[i].nvml_id == nvml_id)
            return (int)i;
    return -1;
}

int sim_ci_shape(uint32_t gpu_slices, uint32_t g, uint32_t c, uint32_t *starts, uint32_t *nstarts)
{
    static const uint32_t sizes7[] = {1, 2, 3, 4, 7};
    static const uint32_t sizes4[] = {1, 2, 4};
    const uint32_t *sizes = gpu_slices == 4 ? sizes4 : sizes7;
    uint32_t nsizes = gpu_slices == 4 ? 3 : 5, ok = 0;
    for (uint32_t i = 0; i < nsizes; i++)
        ok |= sizes[i] == c;
    if (!ok || c == 0 || c > g)
        return 0;
    uint32_t n = 0;
    if (c == g) {
        starts[n++] = 0;
    } else if (c == 3) {
        /* 3-slice CIs sit at 0 and 4 (a 7g GI), like 3g GIs do. */
        for (uint32_t s = 0; s + 3 <= g; s += 4)
            starts[n++] = s;
    } else {
        for (uint32_t s = 0; s + c <= g; s += c)
            starts[n++] = s;
    }
    *nstarts = n;
    return n > 0;
}

uint32_t sim_ci_nvml_id(uint32_t c)
{
    switch (c) {
    case 1: return NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE;
    case 2: return NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE;
    case 3: return NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE;
    case 4: return NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE;
    case 7: return NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE;
    default: return 0xffffffffU;
    }
}

int sim_ci_slices_for_nvml_id(uint32_t id)
{
    switch (id) {
    case NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: return 1;
    case NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: return 2;
    case NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: return 3;
    case NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: return 4;
    case NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: return 7;
    default: return -1;
    }
}
