/* Fake libcuda.so.1: libraries and kernels (CUDA 12), what the CUDA runtime loads a
 * program's fatbins with.  A library holds a copy of its image's text and is loaded into a
 * context (as a module of that context) the first time one of its kernels is used there; a
 * CUkernel may be passed wherever a CUfunction is (cuLaunchKernel, graph kernel nodes), as
 * with the real driver. */
#include "cuda_core.h"

#include <string.h>

struct CUlib_st {
    uint32_t magic;
    char *text;
    size_t len;
    int nkernels;
    struct CUkern_st *kernels;
};

struct CUkern_st {
    uint32_t magic;
    CUlibrary lib;
    char name[sizeof(((struct sim_kernel *)0)->name)];
};

static void library_free(CUlibrary l)
{
    for (size_t i = 0; i < r_mod.n;) {
        CUmodule m = r_mod.items[i];
        if (m->lib == l)
            module_free(m);
        else
            i++;
    }
    for (int i = 0; i < l->nkernels; i++) {
        reg_del(&r_kern, &l->kernels[i]);
        l->kernels[i].magic = 0;
    }
    reg_del(&r_lib, l);
    free(l->kernels);
    free(l->text);
    l->magic = 0;
    free(l);
}

/* The library's module in context c, loaded there if it is not yet. Caller holds g_mu. */
static CUresult library_module(CUlibrary l, CUcontext c, CUmodule *pm)
{
    for (size_t i = 0; i < r_mod.n; i++) {
        CUmodule m = r_mod.items[i];
        if (m->lib == l && m->ctx == c) {
            *pm = m;
            return CUDA_SUCCESS;
        }
    }
    CUresult rc = module_load_locked(c, l->text, l->len, pm);
    if (rc == CUDA_SUCCESS)
        (*pm)->lib = l;
    return rc;
}

static CUresult kernel_function(CUkernel k, CUfunction *pf)
{
    CUcontext c = NULL;
    CUmodule m = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = library_module(k->lib, c, &m);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (int i = 0; i < m->nfuncs; i++)
        if (strcmp(m->funcs[i].k.name, k->name) == 0) {
            *pf = &m->funcs[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

CUfunction func_resolve(CUfunction f)
{
    if (reg_has(&r_func, f))
        return f;
    CUfunction out = NULL;
    if (reg_has(&r_kern, f) && kernel_function((CUkernel)(void *)f, &out) == CUDA_SUCCESS)
        return out;
    return NULL;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *pl, const void *code, CUjit_option *jo, void **jv, unsigned njo,
                                  CUlibraryOption *lo, void **lv, unsigned nlo)
{
    (void)jo, (void)jv, (void)njo, (void)lo, (void)lv, (void)nlo;
    ENTER();
    if (!pl || !code)
        return CUDA_ERROR_INVALID_VALUE;
    const char *text = NULL;
    size_t len = 0;
    CUresult rc = module_image(code, &text, &len);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUlibrary l = calloc(1, sizeof *l);
    if (!l || !(l->text = strndup(text, len))) {
        free(l);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    l->magic = MAGIC_LIB;
    l->len = len;
    pthread_mutex_lock(&g_mu);
    /* parse it once, outside any context, for its kernels' names */
    CUmodule probe = NULL;
    rc = module_load_locked(NULL, l->text, l->len, &probe);
    if (rc == CUDA_SUCCESS) {
        l->nkernels = probe->nfuncs;
        l->kernels = calloc((size_t)(probe->nfuncs ? probe->nfuncs : 1), sizeof *l->kernels);
        for (int i = 0; l->kernels && i < probe->nfuncs; i++) {
            l->kernels[i].magic = MAGIC_KERN;
            l->kernels[i].lib = l;
            sim_copy_str(l->kernels[i].name, sizeof l->kernels[i].name, probe->funcs[i].k.name);
        }
        module_free(probe);
        if (!l->kernels)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    int added = 0;
    if (rc == CUDA_SUCCESS && reg_add(&r_lib, l) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; rc == CUDA_SUCCESS && i < l->nkernels; i++, added++)
        if (reg_add(&r_kern, &l->kernels[i]) != 0)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        *pl = l;
    } else {
        for (int i = 0; i < added; i++)
            reg_del(&r_kern, &l->kernels[i]);
        reg_del(&r_lib, l);
        free(l->kernels);
        free(l->text);
        free(l);
    }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuLibraryUnload(CUlibrary l)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_lib, l) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        library_free(l);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pk, CUlibrary l, const char *name)
{
    ENTER();
    if (!pk || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_lib, l) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
    for (int i = 0; rc == CUDA_ERROR_NOT_FOUND && i < l->nkernels; i++)
        if (strcmp(l->kernels[i].name, name) == 0) {
            *pk = &l->kernels[i];
            rc = CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* A query of a library or kernel handle: one row each (as CTX_GETTER in cuda_context.c). */
#define HANDLE_GETTER(fn, params, reg, handle, value)                                   \
    EXPORT CUresult fn params                                                           \
    {                                                                                   \
        ENTER();                                                                        \
        if (!out)                                                                       \
            return CUDA_ERROR_INVALID_VALUE;                                            \
        pthread_mutex_lock(&g_mu);                                                      \
        CUresult rc = reg_has(&reg, handle) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; \
        if (rc == CUDA_SUCCESS)                                                         \
            *out = value;                                                               \
        pthread_mutex_unlock(&g_mu);                                                    \
        return rc;                                                                      \
    }
HANDLE_GETTER(cuLibraryGetKernelCount, (unsigned *out, CUlibrary l), r_lib, l, (unsigned)l->nkernels)
HANDLE_GETTER(cuKernelGetLibrary, (CUlibrary *out, CUkernel k), r_kern, k, k->lib)
HANDLE_GETTER(cuKernelGetName, (const char **out, CUkernel k), r_kern, k, k->name)

EXPORT CUresult cuLibraryEnumerateKernels(CUkernel *ks, unsigned n, CUlibrary l)
{
    ENTER();
    if (!ks)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_lib, l) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    for (unsigned i = 0; rc == CUDA_SUCCESS && i < n && i < (unsigned)l->nkernels; i++)
        ks[i] = &l->kernels[i];
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuLibraryGetModule(CUmodule *pm, CUlibrary l)
{
    ENTER();
    if (!pm)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = reg_has(&r_lib, l) ? need_ctx(&c) : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        rc = library_module(l, c, pm);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

/* Globals and managed variables: the simulator's modules have none. */
EXPORT CUresult cuLibraryGetGlobal(CUdeviceptr *p, size_t *n, CUlibrary l, const char *name)
{
    (void)p, (void)n, (void)name;
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_lib, l) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuLibraryGetManaged(CUdeviceptr *p, size_t *n, CUlibrary l, const char *name)
{
    return cuLibraryGetGlobal(p, n, l, name);
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pf, CUkernel k)
{
    ENTER();
    if (!pf)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_kern, k) ? kernel_function(k, pf) : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute a, CUkernel k, CUdevice d)
{
    (void)d;
    CUfunction f = NULL;
    CUresult rc = cuKernelGetFunction(&f, k);
    return rc == CUDA_SUCCESS ? cuFuncGetAttribute(pi, a, f) : rc;
}

EXPORT CUresult cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice d)
{
    (void)d;
    CUfunction f = NULL;
    CUresult rc = cuKernelGetFunction(&f, k);
    return rc == CUDA_SUCCESS ? cuFuncSetAttribute(f, a, v) : rc;
}

EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, CUfunc_cache config, CUdevice d)
{
    (void)d;
    CUfunction f = NULL;
    CUresult rc = cuKernelGetFunction(&f, k);
    return rc == CUDA_SUCCESS ? cuFuncSetCacheConfig(f, config) : rc;
}
