/* Fake libcuda.so.1: the per-thread-default-stream twins the driver exports beside the
 * stream-taking entry points it has (what a program built with --default-stream per-thread
 * links, and what cuGetProcAddress's per-thread flag stands for): the same calls, with a NULL
 * stream meaning the calling thread's default stream.  The simulator's default stream is its
 * context's, the same for every thread, so a twin is its base call with that stream. */
#include "cuda_core.h"

static CUstream per_thread(CUstream s)
{
    return s ? s : CU_STREAM_PER_THREAD;
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, per_thread(s), params, extra);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                               void **params)
{
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, per_thread(s), params);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra)
{
    if (!cfg)
        return cuLaunchKernelEx(cfg, f, params, extra);
    CUlaunchConfig c = *cfg;
    c.hStream = per_thread(c.hStream);
    return cuLaunchKernelEx(&c, f, params, extra);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    return cuMemAllocAsync(dptr, bytes, per_thread(s));
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    return cuMemAllocFromPoolAsync(dptr, bytes, pool, per_thread(s));
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    return cuMemFreeAsync(p, per_thread(s));
}

EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s)
{
    return cuGraphLaunch(e, per_thread(s));
}
