/* libtessera: what every source file of the library includes.  Not an API: everything here
 * is hidden inside libtessera.so.
 *
 * Rules: the hook never crashes or hangs its host; no lock is held across a call into the
 * driver; the launch fast path takes no lock, makes no system call and reads no
 * environment variable; nothing in the environment matters while a budget file exists.
 *
 * Each part of the library's state belongs to one file and is read through the functions of
 * that file's header (the hot-path ones inline): driver.h (the driver's entry points),
 * budget_state.h (the budget in force), ledger_attach.h (this process's ledger), ordinal.h
 * (CUDA ordinal -> budget entry), records.h (what each object holds), pools.h (what each
 * memory pool keeps), count.h (the counting step), tokens.h (launch tokens), startup.h (a
 * hook's first call).  See hook/README.md, "Files", for the layering.
 */
#ifndef TESSERA_HOOK_H
#define TESSERA_HOOK_H

#define _GNU_SOURCE
#include <cuda.h>
#include <nvml.h>

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>

/* Every header of the library declares its names hidden (as the library is built with
 * -fvisibility=hidden), so the other files reach its globals PC-relative, without a GOT
 * load: the hot paths are as short as in one file.  The hooks themselves are marked EXPORT. */
#pragma GCC visibility push(hidden)

/* cuda.h maps legacy names onto their current versions; we hook both, under their own names. */
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuGetProcAddress
#undef cuCtxCreate
#undef cuCtxDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define LIKELY(x) __builtin_expect(!!(x), 1)

/* ---- prototypes of the hooked names cuda.h does not declare under these names ---- */
EXPORT CUresult CUDAAPI cuMemAlloc(unsigned int *dptr, unsigned int bytesize);
EXPORT CUresult CUDAAPI cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch, unsigned int w,
                                        unsigned int h, unsigned int esz);
EXPORT CUresult CUDAAPI cuMemFree(unsigned int dptr);
EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int *free_, unsigned int *total);
EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *a, const void *desc);
EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *a, const void *desc);
EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags);
EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev);
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev);
EXPORT __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
EXPORT __typeof__(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
EXPORT __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
EXPORT __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
EXPORT __typeof__(cuLaunchKernelEx) cuLaunchKernelEx_ptsz;
EXPORT __typeof__(cuLaunchCooperativeKernel) cuLaunchCooperativeKernel_ptsz;
EXPORT __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

/* ---- logging (log.c): one line per distinct event ---- */
void th_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define LOG_ONCE(...)                                                   \
    do {                                                                \
        static int once_;                                               \
        if (!__atomic_exchange_n(&once_, 1, __ATOMIC_RELAXED))          \
            th_log(__VA_ARGS__);                                        \
    } while (0)

/* An in-process spinlock, for a few hundred instructions at most (never across a driver
 * call). */
static inline void spin_lock(int *mu)
{
    for (unsigned spins = 0; __atomic_exchange_n(mu, 1, __ATOMIC_ACQUIRE); spins++) {
        if (spins > 100)
            sched_yield();
        else
            __builtin_ia32_pause();
    }
}
static inline void spin_unlock(int *mu) { __atomic_store_n(mu, 0, __ATOMIC_RELEASE); }

/* Legacy 32-bit (v1) entry points: refused, so they cannot be used to go around the count. */
#define LEGACY_REFUSE(name)                                                                \
    do {                                                                                   \
        LOG_ONCE("legacy %s refused (use the _v2 API)", #name);                            \
        return CUDA_ERROR_NOT_SUPPORTED;                                                   \
    } while (0)

#pragma GCC visibility pop
#endif
