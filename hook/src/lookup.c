/* libtessera: the lookup paths.  glibc's own dlsym/dlvsym/dlmopen (found by walking libc's
 * symbol table, as our exported dlsym answers normal lookups), cuGetProcAddress(_v2), the
 * dlsym/dlvsym filters dlfcn_tramp.S calls, and dlmopen redirection. */
#include "hook.h"

#include <elf.h>
#include <link.h>
#include <string.h>

/* ====================================================================================
 * glibc's own dlsym/dlvsym/dlmopen, found by walking libc's dynamic symbol table (our own
 * exported dlsym would answer any normal lookup).
 * ==================================================================================== */
HIDDEN void *tessera_dlsym_unavailable(void *h, const char *n);
HIDDEN void *tessera_dlsym_unavailable(void *h, const char *n)
{
    (void)h;
    (void)n;
    return NULL;
}
HIDDEN void *tessera_dlvsym_unavailable(void *h, const char *n, const char *v);
HIDDEN void *tessera_dlvsym_unavailable(void *h, const char *n, const char *v)
{
    (void)h;
    (void)n;
    (void)v;
    return NULL;
}
HIDDEN void *(*tessera_real_dlsym)(void *, const char *) = tessera_dlsym_unavailable;
HIDDEN void *(*tessera_real_dlvsym)(void *, const char *, const char *) = tessera_dlvsym_unavailable;
static void *(*real_dlmopen)(Lmid_t, const char *, int);

/* This runs before anything else is set up (a sanitizer runtime resolves its own
 * interceptors through our dlsym while it initialises): no instrumentation, no libc string
 * functions, no dl_iterate_phdr; the loader's link map is read directly. */
#define NOSAN __attribute__((no_sanitize("address", "undefined"), noinline))

NOSAN static int s_eq(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

NOSAN static int s_has(const char *hay, const char *needle)
{
    for (; *hay; hay++) {
        const char *h = hay, *n = needle;
        while (*n && *h == *n) {
            h++;
            n++;
        }
        if (!*n)
            return 1;
    }
    return 0;
}

NOSAN static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

NOSAN static void *elf_find(const struct link_map *m, const char *sym)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gh = NULL;
    const ElfW(Half) *versym = NULL;
    for (const ElfW(Dyn) *dyn = m->l_ld; dyn && dyn->d_tag != DT_NULL; dyn++) {
        ElfW(Addr) p = dyn->d_un.d_ptr;
        if (p < m->l_addr)
            p += m->l_addr;
        switch (dyn->d_tag) {
        case DT_SYMTAB: symtab = (const void *)p; break;
        case DT_STRTAB: strtab = (const void *)p; break;
        case DT_GNU_HASH: gh = (const void *)p; break;
        case DT_VERSYM: versym = (const void *)p; break;
        default: break;
        }
    }
    if (!symtab || !strtab || !gh)
        return NULL;
    uint32_t nb = gh[0], symoff = gh[1], bloom = gh[2];
    const ElfW(Addr) *bl = (const void *)(gh + 4);
    const uint32_t *buckets = (const void *)(bl + bloom);
    const uint32_t *chain = buckets + nb;
    uint32_t h = gnu_hash(sym);
    uint32_t i = nb ? buckets[h % nb] : 0;
    if (i < symoff)
        return NULL;
    for (;; i++) {
        uint32_t c = chain[i - symoff];
        if ((c | 1) == (h | 1) && s_eq(strtab + symtab[i].st_name, sym) &&
            symtab[i].st_shndx != SHN_UNDEF && (!versym || !(versym[i] & 0x8000)))
            return (void *)(m->l_addr + symtab[i].st_value);
        if (c & 1)
            return NULL;
    }
}

extern struct r_debug _r_debug;

NOSAN static void *libc_sym(const char *name)
{
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next)
        if (m->l_name && s_has(m->l_name, "libc.so.6"))
            return elf_find(m, name);
    return NULL;
}

static int libc_done;
NOSAN static void libc_resolve(void)
{
    if (__atomic_load_n(&libc_done, __ATOMIC_ACQUIRE))
        return;
    void *s = libc_sym("dlsym"), *v = libc_sym("dlvsym"), *m = libc_sym("dlmopen");
    if (s)
        __atomic_store_n(&tessera_real_dlsym, (void *(*)(void *, const char *))s, __ATOMIC_RELAXED);
    if (v)
        __atomic_store_n(&tessera_real_dlvsym, (void *(*)(void *, const char *, const char *))v,
                         __ATOMIC_RELAXED);
    real_dlmopen = (void *(*)(Lmid_t, const char *, int))m;
    __atomic_store_n(&libc_done, 1, __ATOMIC_RELEASE);
}

pthread_once_t libc_once = PTHREAD_ONCE_INIT;
void libc_init(void)
{
    libc_resolve();
    if (tessera_real_dlsym == tessera_dlsym_unavailable || !real_dlmopen)
        th_log("cannot find glibc's dlsym/dlvsym/dlmopen; dynamic lookups will fail");
}

/* ====================================================================================
 * Lookup paths: cuGetProcAddress, dlsym, dlvsym, dlmopen.
 * ==================================================================================== */
NOSAN static int find_name(const char *name)
{
    if (!name || (name[0] != 'c' && name[0] != 'n'))
        return -1;
    for (int i = 0; i < IDX_COUNT; i++)
        if (s_eq(th_table[i].name, name))
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
        if (s_eq(name, "dlsym"))
            return (void *)&dlsym;
        if (s_eq(name, "dlvsym"))
            return (void *)&dlvsym;
        if (s_eq(name, "dlmopen"))
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
    libc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version);
NOSAN HIDDEN void *tessera_dlvsym_filter(void *handle, const char *name, const char *version)
{
    (void)handle;
    (void)version;
    libc_resolve();
    return maybe_ours(name) ? lookup_hook(name) : NULL;
}

/* A library loaded into a new link-map namespace would reach the driver without us: when
 * the namespace contains libcuda or libnvidia-ml, load it into the base namespace instead. */
EXPORT void *dlmopen(Lmid_t lmid, const char *file, int flags)
{
    pthread_once(&libc_once, libc_init);
    if (!real_dlmopen)
        return NULL;
    if (lmid != LM_ID_BASE && file &&
        (strstr(file, "libcuda.so") || strstr(file, "libnvidia-ml.so"))) {
        LOG_ONCE("dlmopen of %s into a new namespace: using the base namespace", file);
        return dlopen(file, flags);
    }
    void *h = real_dlmopen(lmid, file, flags);
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
