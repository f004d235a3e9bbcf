/* MIG profile tables of the simulated hardware and the placement rules the driver applies.
 * These are the simulator's own (it plays the hardware); a test checks them against the
 * planner's catalog through NVML. */
#ifndef TESSERA_SIM_MIGTABLE_H
#define TESSERA_SIM_MIGTABLE_H

#include <stdint.h>

struct sim_mig_profile {
    const char *name;         /* e.g. "3g.20gb", "1g.10gb+me" */
    uint32_t nvml_id;         /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t smi_id;          /* the "Profile ID" nvidia-smi prints */
    uint32_t mem_slices;
    uint32_t compute_slices;
    uint32_t max_count;
    uint32_t nstarts;
    uint32_t starts[8];
    uint64_t memory_mib;
    uint32_t sm;
    uint32_t ce, dec, enc, jpeg, ofa;
};

struct sim_mig_table {
    const char *model_id;
    uint32_t mem_slices;
    uint32_t compute_slices;
    const struct sim_mig_profile *profiles;
    uint32_t nprofiles;
};

int sim_mig_table_for(const char *model_id);  /* -1: not MIG capable */
const struct sim_mig_table *sim_mig_table(int table);
const struct sim_mig_profile *sim_mig_profile(int table, int profile);
int sim_mig_profile_by_nvml_id(int table, uint32_t nvml_id); /* -1 when absent */

/* Compute-instance profiles inside a GI of g compute slices (gpu_slices: 7 or 4).
 * Returns 1 when a CI of c slices exists and fills its starts. */
int sim_ci_shape(uint32_t gpu_slices, uint32_t g, uint32_t c, uint32_t *starts, uint32_t *nstarts);
uint32_t sim_ci_nvml_id(uint32_t c);          /* NVML_COMPUTE_INSTANCE_PROFILE_* for c slices */
int sim_ci_slices_for_nvml_id(uint32_t id);   /* inverse; -1 when unknown */

#endif
