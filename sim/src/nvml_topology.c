/* Fake libnvidia-ml.so.1: topology.  The host NUMA node each GPU is attached to (as memory
 * affinity), the common ancestor of two GPUs, and NVLink: each link's state, the PCI
 * information and type of the device at its far end.  From the node description
 * (`numa_node`, `nvlink` keys; README.md, "Topology"), fixed for the node's life, so read
 * without the lock.  MIG device handles: NVML_ERROR_NOT_SUPPORTED (topology is the physical
 * GPU's). */
#include "nvml_core.h"

_Static_assert(SIM_NVLINKS == NVML_NVLINK_MAX_LINKS, "one simulated link per NVML link index");

#define BITS_PER_WORD (8 * sizeof(unsigned long))

/* Link `link` of a physical GPU handle: the GPU at its far end, -1 when inactive (an inactive
 * link has no far end: NOT_SUPPORTED where `active_only`). */
static nvmlReturn_t link_peer(nvmlDevice_t d, unsigned link, const void *out, int active_only, int *peer)
{
    CHECK_DEV(d);
    if (!out || link >= SIM_NVLINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d))
        return NVML_ERROR_NOT_SUPPORTED;
    *peer = S()->gpu[d->gpu].nvlink[link];
    return *peer < 0 && active_only ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

/* The queries of one NVLink link: `out` is the output parameter, `peer` the far end's GPU
 * index in `answer` (tools/gen_nvml_stubs.py reads these rows as definitions). */
#define LINK_QUERY(fn, out_t, out, active_only, answer)                                    \
    EXPORT nvmlReturn_t fn(nvmlDevice_t d, unsigned int link, out_t *out)                  \
    {                                                                                      \
        ENTER();                                                                           \
        int peer = -1;                                                                     \
        nvmlReturn_t rc = link_peer(d, link, out, active_only, &peer);                     \
        if (rc != NVML_SUCCESS)                                                            \
            return rc;                                                                     \
        answer;                                                                            \
        return NVML_SUCCESS;                                                               \
    }

/* Only where the GPU itself is a NUMA node (Grace Hopper and later, coherent platforms);
 * on the PCIe hosts this simulates, real NVML answers NOT_SUPPORTED too: the node a GPU is
 * attached to comes from nvmlDeviceGetMemoryAffinity (NVML_AFFINITY_SCOPE_NODE). */
DEVICE_QUERY(nvmlDeviceGetNumaNodeId, (nvmlDevice_t d, unsigned int *node), !node, 1, (void)node)

/* The NUMA nodes nearest the GPU: its own, in either scope (a NUMA node per socket here). */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t d, unsigned int size, unsigned long *set,
                                               nvmlAffinityScope_t scope)
{
    ENTER();
    CHECK_DEV(d);
    if (!size || !set || (scope != NVML_AFFINITY_SCOPE_NODE && scope != NVML_AFFINITY_SCOPE_SOCKET))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(d))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned node = (unsigned)S()->gpu[d->gpu].numa_node;
    memset(set, 0, size * sizeof *set);
    if (node / BITS_PER_WORD < size)
        set[node / BITS_PER_WORD] = 1UL << (node % BITS_PER_WORD);
    return NVML_SUCCESS;
}

/* The simulator has no PCIe switches: one GPU is INTERNAL to itself, two GPUs on one NUMA
 * node meet at NODE, on two nodes at SYSTEM. */
EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, nvmlGpuTopologyLevel_t *path)
{
    ENTER();
    CHECK_DEV(a);
    CHECK_DEV(b);
    if (!path)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig_handle(a) || is_mig_handle(b))
        return NVML_ERROR_NOT_SUPPORTED;
    if (a->gpu == b->gpu)
        *path = NVML_TOPOLOGY_INTERNAL;
    else if (S()->gpu[a->gpu].numa_node == S()->gpu[b->gpu].numa_node)
        *path = NVML_TOPOLOGY_NODE;
    else
        *path = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

/* Every link index below NVML_NVLINK_MAX_LINKS exists; the configured ones are active. */
LINK_QUERY(nvmlDeviceGetNvLinkState, nvmlEnableState_t, active, 0,
           *active = peer >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)
/* The GPU at the far end of an active link (sub-system ID not filled, as the header says). */
LINK_QUERY(nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlPciInfo_t, pci, 1,
           (fill_pci(&S()->gpu[peer], pci), pci->pciSubSystemId = 0))
/* Links join GPUs directly (no NVSwitch is simulated). */
LINK_QUERY(nvmlDeviceGetNvLinkRemoteDeviceType, nvmlIntNvLinkDeviceType_t, type, 1,
           *type = NVML_NVLINK_DEVICE_TYPE_GPU)

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t d, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(d, link, pci);
}
