/* Fake libcuda.so.1: arrays and mipmapped arrays.  An array is charged its device bytes
 * (rows padded to 512 bytes, every mip level) to the current context's device. */
#include "cuda_core.h"

#include <string.h>

static size_t format_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

struct CUarray_st {
    uint32_t magic;
    CUDA_ARRAY3D_DESCRIPTOR desc;
};

struct CUmipmappedArray_st {
    uint32_t magic;
    unsigned levels;
    struct CUarray_st level[32]; /* what cuMipmappedArrayGetLevel hands out; owned here */
};

/* The descriptor of mip level `l` of d: every extent halves, down to 1 (0 stays 0). */
static CUDA_ARRAY3D_DESCRIPTOR mip_level(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned l)
{
    CUDA_ARRAY3D_DESCRIPTOR o = *d;
    o.Width = d->Width >> l ? d->Width >> l : 1;
    o.Height = d->Height ? (d->Height >> l ? d->Height >> l : 1) : 0;
    o.Depth = d->Depth ? (d->Depth >> l ? d->Depth >> l : 1) : 0;
    return o;
}

/* Device bytes of an array with `levels` mip levels (rows padded to 512 bytes). */
static CUresult array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels, size_t *out)
{
    size_t eb = format_bytes(d->Format);
    if (eb == 0 || d->Width == 0 || (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    size_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        CUDA_ARRAY3D_DESCRIPTOR m = mip_level(d, l);
        size_t h = m.Height ? m.Height : 1, depth = m.Depth ? m.Depth : 1;
        if (m.Width > SIZE_MAX / 64)
            return CUDA_ERROR_OUT_OF_MEMORY;
        size_t row = (m.Width * eb * m.NumChannels + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
        if (h > SIZE_MAX / row || depth > SIZE_MAX / (row * h) || total > SIZE_MAX - row * h * depth)
            return CUDA_ERROR_OUT_OF_MEMORY;
        total += row * h * depth;
    }
    *out = total;
    return CUDA_SUCCESS;
}

/* An array object (heap memory, freed with it) of `bytes` device memory: charged to the current
 * context's device and recorded as an allocation of `kind`; freed on failure. */
static CUresult array_record(void *obj, size_t bytes, enum alloc_kind kind)
{
    if (!obj)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = charge(c->dev, bytes);
    struct alloc *a = rc == CUDA_SUCCESS ? alloc_add() : NULL;
    if (rc == CUDA_SUCCESS && !a) {
        uncharge(c->dev, bytes);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (a)
        alloc_set(a, (uintptr_t)obj, bytes, bytes, kind, c->dev, c);
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        free(obj);
    return rc;
}

static CUresult array_destroy(void *obj, enum alloc_kind kind)
{
    pthread_mutex_lock(&g_mu);
    struct alloc *a = alloc_find((uintptr_t)obj, kind);
    CUresult rc = a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (a) {
        uncharge(a->dev, a->charged);
        alloc_remove(a);
        free(obj);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

static CUresult array_create(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    size_t bytes = 0;
    if (!pa)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = array_bytes(d, 1, &bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUarray_st *arr = calloc(1, sizeof *arr);
    if (arr) {
        arr->magic = 0x41525231u;
        arr->desc = *d;
    }
    rc = array_record(arr, bytes, A_ARRAY);
    if (rc == CUDA_SUCCESS)
        *pa = arr;
    return rc;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *pa, const CUDA_ARRAY_DESCRIPTOR *d)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = d->Width, .Height = d->Height, .Depth = 0, .Format = d->Format, .NumChannels = d->NumChannels, .Flags = 0};
    return array_create(pa, &d3);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *pa, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    ENTER();
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(pa, d);
}

/* A live array: one of ours, or a level of a live mipmapped array.  Caller holds g_mu. */
static int array_live(CUarray arr)
{
    if (alloc_find((uintptr_t)arr, A_ARRAY))
        return 1;
    for (size_t i = 0; i < g_nalloc; i++) {
        const struct CUmipmappedArray_st *m = (const void *)g_alloc[i].ptr;
        if (g_alloc[i].kind == A_MIPMAP && arr >= &m->level[0] && arr < &m->level[m->levels])
            return 1;
    }
    return 0;
}

EXPORT CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *out, CUarray arr)
{
    ENTER();
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = array_live(arr) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS) {
        out->Width = arr->desc.Width;
        out->Height = arr->desc.Height;
        out->Format = arr->desc.Format;
        out->NumChannels = arr->desc.NumChannels;
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuArrayDestroy(CUarray arr)
{
    ENTER();
    return array_destroy(arr, A_ARRAY);
}

/* Mipmapped arrays: every level is charged at creation; the levels belong to the array. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pm, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    ENTER();
    if (!pm || !d || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t longest = d->Width > d->Height ? d->Width : d->Height;
    longest = longest > d->Depth ? longest : d->Depth;
    unsigned max_levels = 1;
    while (max_levels < 32 && (longest >> max_levels))
        max_levels++;
    if (levels > max_levels)
        return CUDA_ERROR_INVALID_VALUE;
    size_t bytes = 0;
    CUresult rc = array_bytes(d, levels, &bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct CUmipmappedArray_st *m = calloc(1, sizeof *m);
    if (m) {
        m->magic = 0x4d495031u;
        m->levels = levels;
        for (unsigned l = 0; l < levels; l++) {
            m->level[l].magic = 0x41525231u;
            m->level[l].desc = mip_level(d, l);
        }
    }
    rc = array_record(m, bytes, A_MIPMAP);
    if (rc == CUDA_SUCCESS)
        *pm = m;
    return rc;
}

EXPORT CUresult cuMipmappedArrayGetLevel(CUarray *pa, CUmipmappedArray m, unsigned int level)
{
    ENTER();
    if (!pa)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = alloc_find((uintptr_t)m, A_MIPMAP) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS && level >= m->levels)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *pa = &m->level[level];
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m)
{
    ENTER();
    return array_destroy(m, A_MIPMAP);
}
