/* Fake libcuda.so.1: virtual memory management.  cuMemCreate charges physical memory (no
 * context needed, as with the real driver), an address range is reserved PROT_NONE, a
 * mapping makes it accessible; a released handle is freed when its last mapping goes. */
#include "cuda_core.h"

#include <string.h>

static uintptr_t g_next_handle = 0x1000; /* VMM handles: 0x10 apart from here */

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o)
{
    ENTER();
    (void)o;
    if (!g || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    *g = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER();
    if (!h || !prop || flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.id < 0 || prop->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    /* Physical memory belongs to the process, not to a context: no current context needed,
     * as with the real driver. */
    pthread_mutex_lock(&g_mu);
    CUresult rc = charge(prop->location.id, size);
    if (rc == CUDA_SUCCESS) {
        struct alloc *a = alloc_add();
        if (!a) {
            uncharge(prop->location.id, size);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            a->ptr = g_next_handle;
            g_next_handle += 0x10;
            a->size = size;
            a->charged = size;
            a->kind = A_VMM_HANDLE;
            a->dev = prop->location.id;
            a->ctx = NULL; /* physical handles outlive contexts until released */
            *h = (CUmemGenericAllocationHandle)a->ptr;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)h, A_VMM_HANDLE);
    CUresult rc = a && !a->released ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        if (a->maps > 0) {
            a->released = 1; /* memory is freed when the last mapping goes */
        } else {
            uncharge(a->dev, a->charged);
            alloc_remove(a);
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    ENTER();
    (void)addr;
    if (!ptr || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 || (align & (align - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t al = align > VMM_GRANULARITY ? align : VMM_GRANULARITY;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_SUCCESS;
    void *raw = map_bytes(size + al, PROT_NONE);
    struct alloc *a = raw ? alloc_add() : NULL;
    if (!a) {
        if (raw)
            munmap(raw, size + al);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        uintptr_t p = ((uintptr_t)raw + al - 1) & ~(uintptr_t)(al - 1);
        if (p > (uintptr_t)raw)
            munmap(raw, p - (uintptr_t)raw);
        uintptr_t tail = p + size, rend = (uintptr_t)raw + size + al;
        if (rend > tail)
            munmap((void *)tail, rend - tail);
        a->ptr = p;
        a->size = size;
        a->kind = A_VA_RANGE;
        a->dev = -1;
        *ptr = (CUdeviceptr)p;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)ptr, A_VA_RANGE);
    CUresult rc = a && a->size == size && a->maps == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS) {
        munmap((void *)a->ptr, a->size);
        alloc_remove(a);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* A mapping is recorded as its own entry (kind A_VA_RANGE with dev >= 0). */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags)
{
    ENTER();
    if (flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 || offset != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct alloc *ha = alloc_find((uintptr_t)h, A_VMM_HANDLE);
    struct alloc *range = NULL;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *r = &g_alloc[i];
        if (r->kind == A_VA_RANGE && r->dev < 0 && (uintptr_t)ptr >= r->ptr && (uintptr_t)ptr - r->ptr <= r->size &&
            size <= r->size - ((uintptr_t)ptr - r->ptr))
            range = r;
    }
    CUresult rc = ha && !ha->released && range && size <= ha->size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && (uintptr_t)ptr < m->ptr + m->size && m->ptr < (uintptr_t)ptr + size)
            rc = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    }
    if (rc == CUDA_SUCCESS) {
        struct alloc *m = alloc_add();
        if (!m) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            ha = alloc_find((uintptr_t)h, A_VMM_HANDLE); /* alloc_add may have moved it */
            for (size_t i = 0; i < g_nalloc; i++)
                if (g_alloc[i].kind == A_VA_RANGE && g_alloc[i].dev < 0 && (uintptr_t)ptr >= g_alloc[i].ptr &&
                    (uintptr_t)ptr < g_alloc[i].ptr + g_alloc[i].size)
                    g_alloc[i].maps++;
            m->ptr = (uintptr_t)ptr;
            m->size = size;
            m->kind = A_VA_RANGE;
            m->dev = ha->dev;
            m->handle = (uintptr_t)h;
            ha->maps++;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    ENTER();
    if (!desc || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && m->ptr == (uintptr_t)ptr && m->size == size)
            rc = CUDA_SUCCESS;
    }
    for (size_t i = 0; rc == CUDA_SUCCESS && i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 || desc[i].location.id >= g_ndev)
            rc = CUDA_ERROR_INVALID_DEVICE;
    if (rc == CUDA_SUCCESS) {
        int prot = desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
                   : desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READ   ? PROT_READ
                                                                      : PROT_NONE;
        if (mprotect((void *)(uintptr_t)ptr, size, prot) != 0)
            rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *m = &g_alloc[i];
        if (m->kind == A_VA_RANGE && m->dev >= 0 && m->ptr == (uintptr_t)ptr && m->size == size) {
            uintptr_t h = m->handle;
            mprotect((void *)m->ptr, m->size, PROT_NONE);
            madvise((void *)m->ptr, m->size, MADV_DONTNEED);
            alloc_remove(m);
            for (size_t j = 0; j < g_nalloc; j++)
                if (g_alloc[j].kind == A_VA_RANGE && g_alloc[j].dev < 0 && (uintptr_t)ptr >= g_alloc[j].ptr &&
                    (uintptr_t)ptr < g_alloc[j].ptr + g_alloc[j].size && g_alloc[j].maps > 0)
                    g_alloc[j].maps--;
            struct alloc *ha = alloc_find(h, A_VMM_HANDLE);
            if (ha && --ha->maps == 0 && ha->released) {
                uncharge(ha->dev, ha->charged);
                alloc_remove(ha);
            }
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}
