/* Shared run-time state of one simulated GPU node.
 *
 * One memory-mapped file holds everything every process of the node must agree on: the
 * GPUs (from the node description), MIG instances, per-process memory and contexts, the
 * device timelines of the kernel time model, and the shared fault table.  A robust
 * process-shared mutex guards it; a holder killed mid-update is recovered (EOWNERDEAD)
 * and dead processes are reaped (see simproc.c) so their memory is never counted.
 * Totals are always computed from the per-process slots, so no derived counter can be
 * left inconsistent by a crash.
 */
#ifndef TESSERA_SIM_STATE_H
#define TESSERA_SIM_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SIM_MAGIC 0x7e55e7a51a000006ULL
#define SIM_MAX_GPUS 8
#define SIM_MAX_GIS 8               /* GPU instance slots per GPU */
#define SIM_MAX_CIS 8               /* compute instance slots per GPU instance */
#define SIM_TARGETS (1 + SIM_MAX_GIS) /* slot 0: whole GPU, slot 1+k: GPU instance k */
#define SIM_MAX_PROCS 128
#define SIM_BUSY_RING 2048
#define SIM_MAX_FAULTS 32
#define SIM_FN_NAME 64
#define SIM_NVLINKS 18              /* NVLink links per GPU (NVML_NVLINK_MAX_LINKS) */
#define MIB (1024ULL * 1024ULL)
#define SIM_PROC_LOCK_BASE (1LL << 40) /* OFD lock byte of process slot i: base + i */

struct sim_ci {
    int32_t used;
    uint32_t id;          /* compute instance ID inside the GI */
    uint32_t profile_id;  /* NVML_COMPUTE_INSTANCE_PROFILE_* */
    uint32_t start;       /* compute-slice placement */
    uint32_t size;
    uint32_t serial;      /* bumps on every creation: part of the MIG UUID */
};

struct sim_gi {
    int32_t used;
    uint32_t id;          /* GPU instance ID (binary-tree node of its placement) */
    int32_t profile;      /* index into the GPU's MIG profile table */
    uint32_t start;       /* memory-slice placement */
    uint32_t serial;
    struct sim_ci ci[SIM_MAX_CIS];
};

struct sim_busy {
    int32_t pid;          /* the process, as in struct sim_proc */
    uint32_t pidns;
    uint64_t start_ns;    /* CLOCK_MONOTONIC */
    uint64_t end_ns;
};

struct sim_timeline {
    uint64_t busy_until_ns;
    uint32_t head;        /* next write position */
    uint32_t count;
    struct sim_busy ring[SIM_BUSY_RING];
};

struct sim_gpu {
    char model_id[32];
    char name[96];
    char uuid[80];
    char pci_bus_id[32];
    uint32_t pci_device_id;
    uint32_t sm_count;
    uint64_t memory_mib;
    int32_t cc_major, cc_minor;
    int32_t mig_current;      /* 0 disabled, 1 enabled */
    int32_t mig_pending;
    int32_t mig_needs_reset;  /* mode change waits for a GPU reset (Ampere, passthrough VMs) */
    int32_t mig_table;        /* index of the MIG profile table, -1: not MIG capable */
    int32_t numa_node;        /* host NUMA node the GPU is attached to */
    int32_t nvlink[SIM_NVLINKS]; /* GPU index at the other end of each link, -1: inactive */
    struct sim_gi gi[SIM_MAX_GIS];
    struct sim_timeline tl[SIM_TARGETS];
};

struct sim_proc {               /* one process: (pidns, pid, start_time) names it */
    int32_t pid;              /* as the process sees itself (getpid), 0: free slot */
    uint32_t pidns;           /* inode of its PID namespace */
    uint64_t start_time;      /* /proc/<pid>/stat field 22: the same in every namespace */
    int32_t seen_pid;         /* its PID in namespace seen_ns, as last found there (0: never) */
    uint32_t seen_ns;
    char name[64];
    uint64_t mem[SIM_MAX_GPUS][SIM_TARGETS];   /* device bytes held */
    uint32_t ctx[SIM_MAX_GPUS][SIM_TARGETS];   /* live contexts */
    int32_t ci[SIM_MAX_GPUS][SIM_TARGETS];     /* compute instance the contexts run on */
    uint64_t busy_ns[SIM_MAX_GPUS][SIM_TARGETS];
};

struct sim_fault {
    char fn[SIM_FN_NAME];
    int32_t remaining;        /* calls left to affect; -1: every call */
    int32_t code;             /* error to return, 0: none (delay only) */
    uint32_t delay_us;
    int32_t pad;
};

struct sim_state {
    uint64_t magic;
    uint64_t size;
    uint64_t node_hash;
    pthread_mutex_t lock;
    uint32_t ngpus;
    uint32_t launch_queue_depth;
    uint64_t default_ns_per_block;
    uint64_t context_mib;
    int32_t cuda_driver_version;
    char driver_version[32];
    char nvml_version[32];
    uint32_t serial;          /* MIG UUID generator */
    struct sim_gpu gpu[SIM_MAX_GPUS];
    struct sim_proc proc[SIM_MAX_PROCS];
    struct sim_fault fault[SIM_MAX_FAULTS];
};

/* Attach (creating or initialising the state file when needed).  0 or -1 with a message
 * in sim_last_error(). Idempotent. */
int sim_attach(void);
void sim_detach(void);
const char *sim_last_error(void);
struct sim_state *sim_state(void);

/* Lock the state (robust; recovers a dead holder).  reap=1 also forgets dead processes. */
int sim_lock(int reap);
void sim_unlock(void);
/* The state file's descriptor of this library: its OFD locks are this process's liveness. */
int sim_state_fd(void);

/* Processes (simproc.c).  All with the lock held. */
void sim_reap_locked(void);              /* free the slots of dead processes */
struct sim_proc *sim_self_locked(void);  /* this process's slot (registers it); NULL: full */
void sim_proc_forget_self(void);         /* fork child: a new process, not yet registered */
void sim_observe_locked(void);           /* find other namespaces' processes in our /proc */
int32_t sim_reported_pid_locked(const struct sim_proc *p); /* the PID NVML reports for p */

/* Memory: bytes held on a target by all processes; capacity of a target in bytes. */
uint64_t sim_used_locked(int gpu, int slot);
uint64_t sim_capacity(int gpu, int slot);
/* Charge (delta > 0) or release this process's bytes.  CUDA_ERROR-free: 0 ok, -1 full. */
int sim_charge_locked(int gpu, int slot, uint64_t bytes);
void sim_uncharge_locked(int gpu, int slot, uint64_t bytes);

/* Time. */
uint64_t sim_now_ns(void);          /* CLOCK_MONOTONIC */
uint64_t sim_mono_to_wall_us(uint64_t mono_ns);
void sim_sleep_until(uint64_t mono_ns);

/* Kernel time model: queue a kernel of cost_ns on a target; returns its end time. */
uint64_t sim_timeline_submit_locked(int gpu, int slot, uint64_t cost_ns, uint64_t now);
/* Busy ns of process p (NULL: all) on a target inside [t0, t1). */
uint64_t sim_timeline_busy_locked(int gpu, int slot, const struct sim_proc *p, uint64_t t0, uint64_t t1);

/* Fault injection: returns the code to fail with (0: proceed), after any delay. */
int sim_fault(const char *fn);
int sim_fault_set(const char *fn, int count, int code, unsigned delay_us);

/* Helpers. */
void sim_copy_str(char *dst, size_t cap, const char *src);
uint32_t sim_gi_tree_id(uint32_t total_slices, uint32_t start, uint32_t size);



/* Device files and visibility (simdev.c; README.md, "Device files and visibility").
 * sim_attach calls sim_dev_load: the node's root is the state file's directory; a node
 * started afresh gets its GPUs' files there (dev/nvidia<minor>) and the capability table
 * (proc/driver/nvidia-caps/mig-minors); TESSERA_SIM_DEV, when set, names the only device
 * files this process has. */
void sim_dev_load(const char *state_path, const struct sim_state *st, int fresh);
/* dev/nvidia-caps/nvidia-cap<N> of a GPU instance's access (ci_id -1) or a compute
 * instance's, as the driver's tools create it when the instance is created. */
void sim_dev_publish_cap(int gpu, uint32_t gi_id, int ci_id);
/* The driver's minor of a MIG access capability (ci_id -1: the GPU instance's); -1 when
 * there is none. */
int sim_cap_minor(int gpu, int gi_id, int ci_id);
/* The GPUs this process sees, in index order: how many, the node's GPU at visible index i
 * (-1: none), the visible index of a node GPU (-1: not visible). */
int sim_gpu_count(void);
int sim_gpu_at(int i);
int sim_gpu_index(int gpu);
/* Whether this process sees a MIG device (ci_id -1: any compute instance of the GPU
 * instance, by its GI access alone). */
int sim_mig_visible(int gpu, uint32_t gi_id, int ci_id);
/* A GPU's visible MIG devices in enumeration order (GI ID, then CI ID): their GI slots + 1
 * and CI slots, at most cap; their number.  Reads the state: hold the lock. */
int sim_mig_devices(int gpu, int *slots, int *cis, int cap);

/* MIG device UUID of a compute instance ("MIG-xxxxxxxx-xxxx-..."), new on every re-creation. */
void sim_mig_uuid(int gpu, int gi_slot, int ci_slot, char *buf, size_t cap);
/* Parse "GPU-…"/"MIG-…" into the 16 UUID bytes; -1 when malformed. */
int sim_uuid_bytes(const char *uuid, unsigned char out[16]);
#endif
