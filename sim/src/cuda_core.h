/* Internal objects of the fake CUDA driver (one process's view). */
#ifndef TESSERA_SIM_CUDA_CORE_H
#define TESSERA_SIM_CUDA_CORE_H

#include <cuda.h>
#include <stdint.h>

#define SIM_MAX_DEVS 16

struct sim_dev {
    int gpu;            /* index into the node's GPUs */
    int slot;           /* 0: whole GPU, 1+k: GPU instance k */
    int ci;             /* compute instance slot, -1 for a whole GPU */
    char uuid[96];
    unsigned char uuid_bytes[16];
    char name[256];
    uint64_t total;     /* bytes */
    int sm;
    CUmemoryPool default_pool;
    CUmemoryPool current_pool;
    CUcontext primary;
};

struct CUctx_st {
    uint32_t magic;
    int dev;
    int primary;
    int active;         /* primary: retained at least once and not reset */
    unsigned refcount;  /* primary retain count */
    unsigned flags;
    uint64_t last_end;  /* latest end of work submitted in this context */
    unsigned long long id;
    CUstream null_stream;
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned flags;
    int priority;
    uint64_t last_end;
    uint64_t *ring;     /* end times of queued kernels (bounded launch queue) */
    uint32_t ring_cap, ring_head, ring_count;
    unsigned long long id;
};

struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned flags;
    int recorded;
    uint64_t t;
};

struct sim_kernel {
    char name[128];
    uint64_t ns_per_block;
    uint64_t fixed_ns;
    int cost_param;     /* kernel parameter (uint64) giving ns per block; -1: none */
};

struct CUmod_st {
    uint32_t magic;
    CUcontext ctx;
    int nfuncs;
    struct CUfunc_st *funcs;
};

struct CUfunc_st {
    uint32_t magic;
    CUmodule mod;
    struct sim_kernel k;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int dev;
    int is_default;
    uint64_t reserved, used, reserved_high, used_high, release_threshold;
};

#endif
