/* libtessera: the lookup paths, from the one table of hooks.def: cuGetProcAddress(_v2), the
 * dlsym/dlvsym filters dlfcn_tramp.S calls, and dlmopen redirection.  glibc's own functions
 * are in glibc.c. */
#include "glibc.h"
#include "startup.h"

#include <link.h>
#include <string.h>

/* The table: every hook, with what the lookup paths need to know of it. */
enum th_class {
    C_ALLOC, C_FREE, C_CTX, C_CTXFREE, C_POOL, C_INFO, C_LAUNCH, C_LEGACY, C_GRAPH, C_GRAPHMEM, C_PROC
};
struct th_entry {
    const char *name, *base;
    int min_version, ptsz;
    enum th_lib lib;
    enum th_class cls;
    void *hook;
};
static const struct th_entry th_table[IDX_COUNT] = {
#define H(lib, name, base, ver, ptsz, cls) {#name, #base, ver, ptsz, LIB_##lib, C_##cls, (void *)&name},
#include "hooks.def"
#undef H
};

NOSAN static int find_name(const char *name)
{
    if (!name || (name[0] != 'c' && name[0] != 'n'))
        return -1;
    for (int i = 0; i < IDX_COUNT; i++)
        if (glibc_streq(th_table[i].name, name))
            return i;
    return -1;
}

static int base_guarded(const char *sym)
{
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_CU && !strcmp(th_table[i].base, sym))
            return 1;
    return 0;
}

/* Map what the driver handed out for (symbol, version, flags) to our hook. */
static void *proc_filter(const char *symbol, void *got, int ver, cuuint64_t flags)
{
    if (!got || !symbol)
        return got;
    for (int i = 0; i < IDX_COUNT; i++)
        if (th_table[i].lib == LIB_CU && real_ptr[i] == got)
            return th_table[i].hook;
    if (!base_guarded(symbol))
        return got;
    int want = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
    for (int pass = 0; pass < 2; pass++, want = 0) {
        int best = -1;
        for (int i = 0; i < IDX_COUNT; i++) {
            const struct th_entry *t = &th_table[i];
            if (t->lib == LIB_CU && t->ptsz == want && !strcmp(t->base, symbol) &&
                t->min_version <= ver && real_ptr[i] &&
                (best < 0 || t->min_version > th_table[best].min_version))
                best = i;
        }
        if (best >= 0)
            return th_table[best].hook;
    }
    return NULL;
}

EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int ver,
                                           cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    CU_READY();
    REAL_OR_FAIL(cuGetProcAddress_v2);
    CUresult r = REAL(cuGetProcAddress_v2)(symbol, pfn, ver, flags, st);
    if (r == CUDA_SUCCESS && pfn && *pfn) {
        void *h = proc_filter(symbol, *pfn, ver, flags);
        if (!h) {
            LOG_ONCE("cuGetProcAddress(%s, %d): no counted variant; refused", symbol, ver);
            *pfn = NULL;
            if (st)
                *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = h;
    }
    return r;
}

EXPORT CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    CU_READY();
    REAL_OR_FAIL(cuGetProcAddress);
    CUresult r = REAL(cuGetProcAddress)(symbol, pfn, ver, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) {
        void *h = proc_filter(symbol, *pfn, ver, flags);
        if (!h) {
            LOG_ONCE("cuGetProcAddress(%s, %d): no counted variant; refused", symbol, ver);
            *pfn = NULL;
            return CUDA_ERROR_NOT_FOUND;
        }
        *pfn = h;
    }
    return r;
}

EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags);

/* Our answer for a looked-up name, or NULL to let glibc answer. */
static void *hook_for(int i);
NOSAN static void *lookup_hook(const char *name)
{
    if (!name)
        return NULL;
    if (name[0] == 'd' && name[1] == 'l') {
        extern void *dlsym(void *, const char *);
        extern void *dlvsym(void *, const char *, const char *);
        if (glibc_streq(name, "dlsym"))
            return (void *)&dlsym;
        if (glibc_streq(name, "dlvsym"))
            return (void *)&dlvsym;
        if (glibc_streq(name, "dlmopen"))
            return (void *)&dlmopen;
        return NULL;
    }
    int i = find_name(name);
    if (i < 0)
        return NULL;
    return hook_for(i);
}

static void *hook_for(int i)
{
    if (th_table[i].lib == LIB_CU)
        pthread_once(&cu_once, cu_init);
    else
        pthread_once(&nvml_once, nvml_init);
    return real_ptr[i] ? th_table[i].hook : NULL;
}

NOSAN static int maybe_ours(const char *name)
{
    return name && ((name[0] == 'c' && name[1] == 'u') || (name[0] == 'n' && name[1] == 'v') ||
                    (name[0] == 'd' && name[1] == 'l'));
}

HIDDEN void *tessera_dlsym_filter(void *handle, const char *name);
NOSAN HIDDEN void *tessera_dlsym_filter(void *handle, const char *name)
{
    (void)handle;
    glibc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version);
NOSAN HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version)
{
    (void)handle;
    (void)version;
    glibc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

/* A library loaded into a new link-map namespace would reach the driver without us: when
 * the namespace contains libcuda or libnvidia-ml, load it into the base namespace instead. */
EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags)
{
    pthread_once(&libc_once, libc_init);
    if (!tessera_real_dlmopen)
        return NULL;
    if (lmid != LM_ID_BASE && file &&
        (strstr(file, "libcuda.so") || strstr(file, "libnvidia-ml.so"))) {
        LOG_ONCE("dlmopen of %s into a new namespace: using the base namespace", file);
        return dlopen(file, flags);
    }
    void *h = tessera_real_dlmopen(lmid, file, flags);
    if (!h || lmid == LM_ID_BASE)
        return h;
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) || !lm)
        return h;
    while (lm->l_prev)
        lm = lm->l_prev;
    int gpu = 0;
    for (; lm; lm = lm->l_next)
        if (lm->l_name && (strstr(lm->l_name, "libcuda.so") || strstr(lm->l_name, "libnvidia-ml.so")))
            gpu = 1;
    if (!gpu)
        return h;
    LOG_ONCE("dlmopen of %s into a new namespace loads the GPU driver: using the base namespace",
             file ? file : "(main)");
    dlclose(h);
    return dlopen(file, flags);
}

/* ---- test support: the table, for the test programs (not part of the API) ---- */
EXPORT int tessera_symbol_count(void);
EXPORT int tessera_symbol_count(void) { return IDX_COUNT; }
EXPORT const char *tessera_symbol_name(int i);
EXPORT const char *tessera_symbol_name(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].name : NULL; }
EXPORT void *tessera_symbol_hook(int i);
EXPORT void *tessera_symbol_hook(int i) { return i >= 0 && i < IDX_COUNT ? th_table[i].hook : NULL; }
