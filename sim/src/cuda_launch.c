/* Fake libcuda.so.1: launches and the kernel time model.  A kernel costs blocks x ns per
 * block (+ fixed); the device (or MIG instance) runs one kernel at a time, first come first
 * served across the node's processes (README.md, "Kernel time model"). */
#include "cuda_core.h"

#include <string.h>

static CUresult launch_validate(const struct launch *l, int cooperative, int dev)
{
    if (!reg_has(&r_func, l->f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (l->gx == 0 || l->gy == 0 || l->gz == 0 || l->bx == 0 || l->by == 0 || l->bz == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (l->gy > 65535 || l->gz > 65535 || l->bx > 1024 || l->by > 1024 || l->bz > 64)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t threads = (uint64_t)l->bx * l->by * l->bz;
    if (threads > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (l->shmem > 232448)
        return CUDA_ERROR_INVALID_VALUE;
    if (cooperative) {
        uint64_t blocks = (uint64_t)l->gx * l->gy * l->gz;
        if (blocks > (uint64_t)g_dev[dev].sm * (uint64_t)max_blocks_per_sm((int)threads))
            return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    }
    return CUDA_SUCCESS;
}

/* Cost = blocks x ns per block (+ fixed).  The device (or MIG instance) runs one kernel at a
 * time, first come first served across all processes of the node; the launch returns at
 * once unless the stream already has launch_queue_depth kernels pending, in which case it
 * blocks until the oldest finishes, as a full push buffer does. */
CUresult launch_do(struct launch *l, int cooperative)
{
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(l->stream, &st);
    if (rc == CUDA_SUCCESS)
        rc = launch_validate(l, cooperative, st->ctx->dev);
    if (rc == CUDA_SUCCESS && l->f->mod->ctx != st->ctx)
        rc = CUDA_ERROR_INVALID_HANDLE;
    if (rc != CUDA_SUCCESS) {
        pthread_mutex_unlock(&g_mu);
        return rc;
    }
    const struct sim_kernel *k = &l->f->k;
    uint64_t per_block = k->cost_param >= 0 && l->has_cost_value ? l->cost_value : k->ns_per_block;
    uint64_t blocks = (uint64_t)l->gx * l->gy * l->gz;
    uint64_t cost = blocks * per_block + k->fixed_ns;
    /* Bounded launch queue. */
    uint64_t wait_until = 0;
    uint64_t now = sim_now_ns();
    while (st->ring_count > 0 && st->ring[(st->ring_head + st->ring_cap - st->ring_count) % st->ring_cap] <= now)
        st->ring_count--;
    if (st->ring_count == st->ring_cap) {
        wait_until = st->ring[(st->ring_head + st->ring_cap - st->ring_count) % st->ring_cap];
        st->ring_count--;
    }
    pthread_mutex_unlock(&g_mu);
    if (wait_until) {
        sim_sleep_until(wait_until);
        now = sim_now_ns();
    }
    pthread_mutex_lock(&g_mu);
    if (!stream_ok(st) || !ctx_usable(st->ctx)) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    struct sim_dev *d = dev_of(st->ctx);
    if (sim_lock(0) != 0) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_UNKNOWN;
    }
    uint64_t end = sim_timeline_submit_locked(d->gpu, d->slot, cost, now);
    sim_unlock();
    st->ring[st->ring_head] = end;
    st->ring_head = (st->ring_head + 1) % st->ring_cap;
    st->ring_count++;
    if (end > st->last_end)
        st->last_end = end;
    if (end > st->ctx->last_end)
        st->ctx->last_end = end;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static CUresult launch_common(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shmem, CUstream s, void **params, void **extra, int coop)
{
    if (params && extra)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    f = func_resolve(f); /* a CUkernel: its function in the current context */
    int cp = f ? f->k.cost_param : -1;
    pthread_mutex_unlock(&g_mu);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    struct launch l = {f, gx, gy, gz, bx, by, bz, shmem, s, 0, 0};
    CUresult captured = CUDA_SUCCESS;
    if (!coop && capture_launch(&l, params, &captured))
        return captured;
    if (cp >= 0) {
        if (!params || !params[cp])
            return CUDA_ERROR_INVALID_VALUE;
        memcpy(&l.cost_value, params[cp], sizeof l.cost_value);
        l.has_cost_value = 1;
    }
    return launch_do(&l, coop);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    ENTER();
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra, 0);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)
{
    ENTER();
    return launch_common(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL, 1);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    ENTER();
    if (!cfg || (cfg->numAttrs > 0 && !cfg->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    int coop = 0;
    for (unsigned i = 0; i < cfg->numAttrs; i++)
        if (cfg->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && cfg->attrs[i].value.cooperative)
            coop = 1;
    return launch_common(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY,
                         cfg->blockDimZ, cfg->sharedMemBytes, cfg->hStream, params, extra, coop);
}
