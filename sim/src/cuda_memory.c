/* Fake libcuda.so.1: device memory (cuMemAlloc_v2, pitched, managed), pinned and registered
 * host memory, copies and memsets.  Device memory is charged to the device (or MIG instance)
 * in the node's shared state; a device pointer is a real host mapping (MAP_NORESERVE), so
 * copies work. */
#include "cuda_core.h"

#include <string.h>

/* Map, charge and record one allocation in the current context. Caller holds g_mu. */
static CUresult dev_alloc(CUdeviceptr *out, size_t bytes, enum alloc_kind kind, CUmemoryPool pool, uint64_t charge_bytes)
{
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (charge_bytes && (rc = charge(c->dev, charge_bytes)) != CUDA_SUCCESS)
        return rc;
    void *p = map_bytes(bytes, PROT_READ | PROT_WRITE);
    struct alloc *a = p ? alloc_add() : NULL;
    if (!a) {
        if (p)
            munmap(p, bytes);
        uncharge(c->dev, charge_bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    alloc_set(a, (uintptr_t)p, bytes, charge_bytes, kind, c->dev, c);
    a->pool = pool;
    *out = (CUdeviceptr)a->ptr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    ENTER();
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, bytes, A_DEVICE, NULL, bytes);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
    ENTER();
    if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, p * height, A_PITCH, NULL, p * height);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    ENTER();
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = dev_alloc(dptr, bytes, A_MANAGED, NULL, bytes);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    ENTER();
    if (p == 0)
        return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *a = &g_alloc[i];
        if (a->ptr == (uintptr_t)p && (a->kind == A_DEVICE || a->kind == A_PITCH || a->kind == A_MANAGED)) {
            /* cuMemFree synchronises with work queued on the device. */
            uint64_t until = a->ctx->last_end;
            dev_release(a);
            pthread_mutex_unlock(&g_mu);
            sim_sleep_until(until);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    ENTER();
    if (!free_b || !total_b)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_dev *d = dev_of(c);
    if (sim_lock(1) != 0)
        return CUDA_ERROR_UNKNOWN;
    uint64_t cap = sim_capacity(d->gpu, d->slot), used = sim_used_locked(d->gpu, d->slot);
    sim_unlock();
    *total_b = cap;
    *free_b = used >= cap ? 0 : cap - used;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_containing((uintptr_t)p, 0);
    CUresult rc = a && a->kind != A_HOST && a->kind != A_HOST_REG ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    if (rc == CUDA_SUCCESS) {
        if (base)
            *base = (CUdeviceptr)a->ptr;
        if (size)
            *size = a->size;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Pinned host memory: host RAM, never charged to the device. */
EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
    ENTER();
    (void)flags;
    if (!pp || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    void *p = NULL;
    struct alloc *a = NULL;
    if (rc == CUDA_SUCCESS) {
        p = map_bytes(bytes, PROT_READ | PROT_WRITE);
        a = p ? alloc_add() : NULL;
        if (!a) {
            if (p)
                munmap(p, bytes);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (rc == CUDA_SUCCESS) {
        alloc_set(a, (uintptr_t)p, bytes, 0, A_HOST, c->dev, c);
        *pp = p;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytes) { return cuMemHostAlloc(pp, bytes, 0); }

EXPORT CUresult cuMemFreeHost(void *p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)p, A_HOST);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (a)
        dev_release(a);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Registered host memory: page-locked in place, never charged to the device.  A range may
 * not overlap another registration; unregistering takes the address it was registered at. */
EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned int flags)
{
    ENTER();
    if (!p || bytes == 0 || (flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                                  CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < g_nalloc; i++) {
        const struct alloc *o = &g_alloc[i];
        if (o->kind == A_HOST_REG && (uintptr_t)p < o->ptr + o->size && o->ptr < (uintptr_t)p + bytes)
            rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_add() : NULL;
    if (rc == CUDA_SUCCESS && !a)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS)
        alloc_set(a, (uintptr_t)p, bytes, 0, A_HOST_REG, c->dev, c);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)p, A_HOST_REG);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    if (a)
        alloc_remove(a);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Copies: the destination/source device ranges must lie inside live allocations. */
static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, int dst_dev, int src_dev, int sync)
{
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS && ((dst_dev && !alloc_containing(dst, n)) || (src_dev && !alloc_containing(src, n))))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && n > 0 && (!dst || !src))
        rc = CUDA_ERROR_INVALID_VALUE;
    uint64_t until = rc == CUDA_SUCCESS ? c->last_end : 0;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (sync)
        sim_sleep_until(until);
    if (n)
        memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)h, n, 1, 0, 1);
}
EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n)
{
    ENTER();
    return copy((uintptr_t)h, (uintptr_t)d, n, 0, 1, 1);
}
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)s, n, 1, 1, 0);
}
EXPORT CUresult cuMemcpy(CUdeviceptr d, CUdeviceptr s, size_t n)
{
    ENTER();
    return copy((uintptr_t)d, (uintptr_t)s, n, 0, 0, 1);
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)s, n, 0, 0, 0);
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)h, n, 1, 0, 0);
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)h, (uintptr_t)d, n, 0, 1, 0);
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
{
    ENTER();
    (void)st;
    return copy((uintptr_t)d, (uintptr_t)s, n, 1, 1, 0);
}

static CUresult memset_n(CUdeviceptr d, unsigned v, size_t n, size_t width)
{
    if (n > SIZE_MAX / width)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS && !alloc_containing((uintptr_t)d, n * width))
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned char *p = (unsigned char *)(uintptr_t)d;
    for (size_t i = 0; i < n; i++)
        memcpy(p + i * width, &v, width); /* little-endian: low bytes first */
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 1);
}
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 2);
}
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n)
{
    ENTER();
    return memset_n(d, v, n, 4);
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    ENTER();
    (void)s;
    return memset_n(d, v, n, 1);
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s)
{
    ENTER();
    (void)s;
    return memset_n(d, v, n, 4);
}
