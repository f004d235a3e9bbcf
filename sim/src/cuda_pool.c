/* Fake libcuda.so.1: the stream-ordered allocator.  A pool keeps what its frees give back
 * reserved (and charged to the device) until a synchronisation trims it down to its release
 * threshold, cuMemPoolTrimTo or its destruction; its allocations are served from what it
 * keeps first. */
#include "cuda_core.h"

#include <string.h>

static CUresult pool_new(int dev, int is_default, CUmemoryPool *out)
{
    CUmemoryPool p = calloc(1, sizeof *p);
    if (!p || reg_add(&r_pool, p) != 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->magic = MAGIC_POOL;
    p->dev = dev;
    p->is_default = is_default;
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult default_pool(int dev, CUmemoryPool *out)
{
    struct sim_dev *d = &g_dev[dev];
    if (!d->default_pool) {
        CUresult rc = pool_new(dev, 1, &d->default_pool);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    if (!d->current_pool)
        d->current_pool = d->default_pool;
    *out = d->default_pool;
    return CUDA_SUCCESS;
}

static CUresult alloc_from_pool(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    if (rc == CUDA_SUCCESS && !pool) {
        rc = default_pool(st->ctx->dev, &pool);
        pool = g_dev[st->ctx->dev].current_pool;
    }
    if (rc == CUDA_SUCCESS && !reg_has(&r_pool, pool))
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS && pool->dev != st->ctx->dev)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        /* Reuse what the pool holds; grow the reservation (charged) for the rest. */
        uint64_t spare = pool->reserved - pool->used;
        uint64_t grow = bytes > spare ? bytes - spare : 0;
        if (grow && (rc = charge(pool->dev, grow)) == CUDA_SUCCESS)
            pool->reserved += grow;
        if (rc == CUDA_SUCCESS) {
            void *p = map_bytes(bytes, PROT_READ | PROT_WRITE);
            struct alloc *a = p ? alloc_add() : NULL;
            if (!a) {
                if (p)
                    munmap(p, bytes);
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                alloc_set(a, (uintptr_t)p, bytes, 0, A_ASYNC, pool->dev, st->ctx);
                a->pool = pool;
                pool->used += bytes;
                if (pool->used > pool->used_high)
                    pool->used_high = pool->used;
                if (pool->reserved > pool->reserved_high)
                    pool->reserved_high = pool->reserved;
                *dptr = (CUdeviceptr)a->ptr;
            }
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    ENTER();
    return alloc_from_pool(dptr, bytes, NULL, s);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream s)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_from_pool(dptr, bytes, pool, s);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUstream st = NULL;
    CUresult rc = stream_lookup(s, &st);
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_find((uintptr_t)p, A_ASYNC) : NULL;
    if (rc == CUDA_SUCCESS && !a)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUmemoryPool pool = a->pool;
        pool->used -= a->size; /* stays reserved in the pool until trimmed */
        munmap((void *)a->ptr, a->size);
        alloc_remove(a);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    ENTER();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (props->location.id < 0 || props->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = pool_new(props->location.id, 0, pool);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) && !pool->is_default ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        /* Live allocations keep their memory until freed; the reservation goes now. */
        for (size_t i = 0; i < g_nalloc; i++)
            if (g_alloc[i].pool == pool)
                g_alloc[i].pool = NULL;
        uncharge(pool->dev, pool->reserved);
        if (g_dev[pool->dev].current_pool == pool)
            g_dev[pool->dev].current_pool = g_dev[pool->dev].default_pool;
        reg_del(&r_pool, pool);
        pool->magic = 0;
        free(pool);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        pool_trim(pool, keep);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult pool_set(CUmemoryPool pool, CUmemPool_attribute attr, const void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = *(const cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (*(const cuuint64_t *)value != 0)
            return CUDA_ERROR_INVALID_VALUE;
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
        break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult pool_get(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = pool->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = pool->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = 1; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* A pool attribute set or read, under g_mu. */
static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, int set)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (reg_has(&r_pool, pool))
        rc = set ? pool_set(pool, attr, value) : pool_get(pool, attr, value);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER();
    return pool_attribute(pool, attr, value, 1);
}

EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    ENTER();
    return pool_attribute(pool, attr, value, 0);
}

EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = default_pool(d, pool);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d)
{
    ENTER();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUmemoryPool p = NULL;
    CUresult rc = default_pool(d, &p);
    if (rc == CUDA_SUCCESS)
        *pool = g_dev[d].current_pool;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool pool)
{
    ENTER();
    CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_pool, pool) && pool->dev == d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        CUmemoryPool p = NULL;
        rc = default_pool(d, &p);
        g_dev[d].current_pool = pool;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
