/* libtessera: device memory.  Every allocation path reserves the bytes in the container's
 * ledger first, then calls the driver, then records what the object holds (or gives the
 * reservation back); frees give the bytes back after the driver succeeds.  The
 * stream-ordered allocator is in mem_async.c, contexts in ctx.c. */
#include "count.h"
#include "startup.h"

/* Device-pointer paths: every argument struct starts with the CUdeviceptr * it fills. */
static void undo_ptr(void *a) { REAL(cuMemFree_v2)(**(CUdeviceptr **)a); }

struct a_alloc { CUdeviceptr *p; size_t n; };
static CUresult call_alloc(void *a_) { struct a_alloc *a = a_; return REAL(cuMemAlloc_v2)(a->p, a->n); }
static const struct counted PATH_ALLOC = {K_PTR, call_alloc, key_ptr, undo_ptr};
EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAlloc_v2);
    if (!dptr)
        return REAL(cuMemAlloc_v2)(dptr, bytesize);
    struct a_alloc a = {dptr, bytesize};
    return counted_alloc(&PATH_ALLOC, &a, -1, bytesize);
}

struct a_managed { CUdeviceptr *p; size_t n; unsigned int f; };
static CUresult call_managed(void *a_) { struct a_managed *a = a_; return REAL(cuMemAllocManaged)(a->p, a->n, a->f); }
static const struct counted PATH_MANAGED = {K_PTR, call_managed, key_ptr, undo_ptr};
EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocManaged);
    if (!dptr)
        return REAL(cuMemAllocManaged)(dptr, bytesize, flags);
    struct a_managed a = {dptr, bytesize, flags};
    return counted_alloc(&PATH_MANAGED, &a, -1, bytesize);
}

EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                          unsigned int esz)
{
    CU_READY();
    REAL_OR_FAIL(cuMemAllocPitch_v2);
    if (!dptr || !pitch)
        return REAL(cuMemAllocPitch_v2)(dptr, pitch, w, h, esz);
    /* Reserve an upper estimate (rows padded to 512 bytes), settle on pitch * height. */
    uint64_t row = w > UINT64_MAX - 511 ? UINT64_MAX : ((uint64_t)w + 511) & ~(uint64_t)511;
    uint64_t est = (h && row > UINT64_MAX / h) ? UINT64_MAX : row * (h ? h : 1);
    int e;
    CUresult r = reserve(-1, est, &e);
    if (r != CUDA_SUCCESS)
        return r;
    ENTER();
    r = REAL(cuMemAllocPitch_v2)(dptr, pitch, w, h, esz);
    LEAVE();
    if (r != CUDA_SUCCESS) {
        unreserve(e, est);
        return r;
    }
    uint64_t actual = (uint64_t)*pitch * (h ? h : 1);
    if (e >= 0 && actual > est) {
        int e2;
        if (reserve(-1, actual - est, &e2) != CUDA_SUCCESS) {
            REAL(cuMemFree_v2)(*dptr);
            unreserve(e, est);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (e >= 0 && actual < est) {
        unreserve(e, est - actual);
    }
    if (remember(K_PTR, (uint64_t)*dptr, e, e >= 0 ? actual : 0)) {
        REAL(cuMemFree_v2)(*dptr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

struct a_create {
    CUmemGenericAllocationHandle *h;
    size_t n;
    const CUmemAllocationProp *prop;
    unsigned long long flags;
};
static CUresult call_create(void *a_) { struct a_create *a = a_; return REAL(cuMemCreate)(a->h, a->n, a->prop, a->flags); }
static uint64_t key_create(void *a_) { return *((struct a_create *)a_)->h; }
static void undo_create(void *a_)
{
    if (REAL(cuMemRelease))
        REAL(cuMemRelease)(*((struct a_create *)a_)->h);
}
static const struct counted PATH_CREATE = {K_HANDLE, call_create, key_create, undo_create};

EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                   const CUmemAllocationProp *prop, unsigned long long flags)
{
    CU_READY();
    REAL_OR_FAIL(cuMemCreate);
    if (!handle || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return REAL(cuMemCreate)(handle, size, prop, flags);
    struct a_create a = {handle, size, prop, flags};
    return counted_alloc(&PATH_CREATE, &a, prop->location.id, size);
}

/* Bytes of an array: width x height x depth x element size, per mip level.  Saturates. */
static uint64_t fmt_bytes(CUarray_format f)
{
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 16; /* unknown: assume the widest element */
    }
}
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    return (a && b > UINT64_MAX / a) ? UINT64_MAX : a * b;
}
static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned levels)
{
    uint64_t elem = mul_sat(fmt_bytes(f), ch ? ch : 1), total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned l = 0; l < levels && l < 64; l++) {
        uint64_t lw = w >> l ? w >> l : 1, lh = h >> l ? h >> l : 1, ld = d >> l ? d >> l : 1;
        total = add_sat(total, mul_sat(mul_sat(mul_sat(lw, lh), ld), elem));
    }
    return total;
}

struct a_arr { CUarray *a; const void *d; unsigned lv; CUmipmappedArray *m; };
static CUresult call_arr(void *x) { struct a_arr *a = x; return REAL(cuArrayCreate_v2)(a->a, a->d); }
static CUresult call_arr3(void *x) { struct a_arr *a = x; return REAL(cuArray3DCreate_v2)(a->a, a->d); }
static CUresult call_mip(void *x) { struct a_arr *a = x; return REAL(cuMipmappedArrayCreate)(a->m, a->d, a->lv); }
static uint64_t key_arr(void *x) { return (uint64_t)(uintptr_t)*((struct a_arr *)x)->a; }
static uint64_t key_mip(void *x) { return (uint64_t)(uintptr_t)*((struct a_arr *)x)->m; }
static void undo_arr(void *x)
{
    if (REAL(cuArrayDestroy))
        REAL(cuArrayDestroy)(*((struct a_arr *)x)->a);
}
static void undo_mip(void *x)
{
    if (REAL(cuMipmappedArrayDestroy))
        REAL(cuMipmappedArrayDestroy)(*((struct a_arr *)x)->m);
}
static const struct counted PATH_ARRAY = {K_ARRAY, call_arr, key_arr, undo_arr};
static const struct counted PATH_ARRAY3D = {K_ARRAY, call_arr3, key_arr, undo_arr};
static const struct counted PATH_MIPMAP = {K_MIPMAP, call_mip, key_mip, undo_mip};

EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *d)
{
    CU_READY();
    REAL_OR_FAIL(cuArrayCreate_v2);
    if (!arr || !d)
        return REAL(cuArrayCreate_v2)(arr, d);
    struct a_arr a = {arr, d, 0, NULL};
    uint64_t b = array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 1);
    return counted_alloc(&PATH_ARRAY, &a, -1, b);
}

EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    CU_READY();
    REAL_OR_FAIL(cuArray3DCreate_v2);
    if (!arr || !d)
        return REAL(cuArray3DCreate_v2)(arr, d);
    struct a_arr a = {arr, d, 0, NULL};
    uint64_t b = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, 1);
    return counted_alloc(&PATH_ARRAY3D, &a, -1, b);
}

EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                              unsigned int levels)
{
    CU_READY();
    REAL_OR_FAIL(cuMipmappedArrayCreate);
    if (!m || !d)
        return REAL(cuMipmappedArrayCreate)(m, d, levels);
    struct a_arr a = {NULL, d, levels, m};
    uint64_t b = array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, levels);
    return counted_alloc(&PATH_MIPMAP, &a, -1, b);
}

/* The frees: the driver frees the object, then the bytes it held are given back.  cuMemFree
 * of 0 frees nothing. */
#define FREE_HOOK(name, type, kind, held)                               \
    EXPORT CUresult CUDAAPI name(type x)                                \
    {                                                                   \
        CU_READY();                                                     \
        REAL_OR_FAIL(name);                                             \
        ENTER();                                                        \
        CUresult r = REAL(name)(x);                                     \
        LEAVE();                                                        \
        if (r == CUDA_SUCCESS && (held))                                \
            forget(kind, (uint64_t)(uintptr_t)x);                       \
        return r;                                                       \
    }
FREE_HOOK(cuMemFree_v2, CUdeviceptr, K_PTR, x != 0)
FREE_HOOK(cuMemRelease, CUmemGenericAllocationHandle, K_HANDLE, 1)
FREE_HOOK(cuArrayDestroy, CUarray, K_ARRAY, 1)
FREE_HOOK(cuMipmappedArrayDestroy, CUmipmappedArray, K_MIPMAP, 1)

EXPORT CUresult CUDAAPI cuMemAlloc(unsigned int *d, unsigned int n) { (void)d; (void)n; LEGACY_REFUSE(cuMemAlloc); }
EXPORT CUresult CUDAAPI cuMemAllocPitch(unsigned int *d, unsigned int *p, unsigned int w, unsigned int h, unsigned int e)
{ (void)d; (void)p; (void)w; (void)h; (void)e; LEGACY_REFUSE(cuMemAllocPitch); }
EXPORT CUresult CUDAAPI cuMemFree(unsigned int d) { (void)d; LEGACY_REFUSE(cuMemFree); }
EXPORT CUresult CUDAAPI cuMemGetInfo(unsigned int *f, unsigned int *t) { (void)f; (void)t; LEGACY_REFUSE(cuMemGetInfo); }
EXPORT CUresult CUDAAPI cuDeviceTotalMem(unsigned int *b, CUdevice d) { (void)b; (void)d; LEGACY_REFUSE(cuDeviceTotalMem); }
EXPORT CUresult CUDAAPI cuArrayCreate(CUarray *a, const void *d) { (void)a; (void)d; LEGACY_REFUSE(cuArrayCreate); }
EXPORT CUresult CUDAAPI cuArray3DCreate(CUarray *a, const void *d) { (void)a; (void)d; LEGACY_REFUSE(cuArray3DCreate); }
