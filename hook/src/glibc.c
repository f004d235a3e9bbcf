/* libtessera: glibc's own dlsym/dlvsym/dlmopen, found by walking libc's dynamic symbol table
 * (our own exported dlsym would answer any normal lookup).
 *
 * This runs before anything else is set up (a sanitizer runtime resolves its own
 * interceptors through our dlsym while it initialises): no instrumentation, no libc string
 * functions, no dl_iterate_phdr; the loader's link map is read directly. */
#include "glibc.h"

#include <elf.h>
#include <link.h>

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
void *(*tessera_real_dlsym)(void *, const char *) = tessera_dlsym_unavailable;
void *(*tessera_real_dlvsym)(void *, const char *, const char *) = tessera_dlvsym_unavailable;
void *(*tessera_real_dlmopen)(Lmid_t, const char *, int);

NOSAN int glibc_streq(const char *a, const char *b)
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

NOSAN int elf_index(const struct link_map *m, struct elf_index *x)
{
    const uint32_t *gh = NULL;
    x->base = m->l_addr;
    x->symtab = NULL;
    x->strtab = NULL;
    x->versym = NULL;
    for (const ElfW(Dyn) *dyn = m->l_ld; dyn && dyn->d_tag != DT_NULL; dyn++) {
        ElfW(Addr) p = dyn->d_un.d_ptr;
        if (p < m->l_addr)
            p += m->l_addr;
        switch (dyn->d_tag) {
        case DT_SYMTAB: x->symtab = (const void *)p; break;
        case DT_STRTAB: x->strtab = (const void *)p; break;
        case DT_GNU_HASH: gh = (const void *)p; break;
        case DT_VERSYM: x->versym = (const void *)p; break;
        default: break;
        }
    }
    if (!x->symtab || !x->strtab || !gh || gh[0] == 0 || gh[2] == 0)
        return 0;
    x->nbuckets = gh[0];
    x->symoff = gh[1];
    x->nbloom = gh[2];
    x->shift = gh[3];
    x->bloom = (const void *)(gh + 4);
    x->buckets = (const void *)(x->bloom + x->nbloom);
    x->chain = x->buckets + x->nbuckets;
    return 1;
}

NOSAN void *elf_find(const struct elf_index *x, const char *sym)
{
    const unsigned bits = 8 * sizeof(ElfW(Addr));
    uint32_t h = gnu_hash(sym);
    ElfW(Addr) w = x->bloom[(h / bits) % x->nbloom];
    if (!((w >> (h % bits)) & (w >> ((h >> x->shift) % bits)) & 1))
        return NULL; /* the bloom filter: not defined here */
    uint32_t i = x->buckets[h % x->nbuckets];
    if (i < x->symoff)
        return NULL;
    for (;; i++) {
        uint32_t c = x->chain[i - x->symoff];
        const ElfW(Sym) *s = &x->symtab[i];
        if ((c | 1) == (h | 1) && glibc_streq(x->strtab + s->st_name, sym) &&
            s->st_shndx != SHN_UNDEF && ELF64_ST_TYPE(s->st_info) == STT_FUNC &&
            (!x->versym || !(x->versym[i] & 0x8000)))
            return (void *)(x->base + s->st_value);
        if (c & 1)
            return NULL;
    }
}

extern struct r_debug _r_debug;

NOSAN static void *libc_sym(const char *name)
{
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next)
        if (m->l_name && s_has(m->l_name, "libc.so.6")) {
            struct elf_index x;
            return elf_index(m, &x) ? elf_find(&x, name) : NULL;
        }
    return NULL;
}

static int libc_done;
NOSAN void glibc_resolve(void)
{
    if (__atomic_load_n(&libc_done, __ATOMIC_ACQUIRE))
        return;
    void *s = libc_sym("dlsym"), *v = libc_sym("dlvsym"), *m = libc_sym("dlmopen");
    if (s)
        __atomic_store_n(&tessera_real_dlsym, (void *(*)(void *, const char *))s, __ATOMIC_RELAXED);
    if (v)
        __atomic_store_n(&tessera_real_dlvsym, (void *(*)(void *, const char *, const char *))v,
                         __ATOMIC_RELAXED);
    tessera_real_dlmopen = (void *(*)(Lmid_t, const char *, int))m;
    __atomic_store_n(&libc_done, 1, __ATOMIC_RELEASE);
}

pthread_once_t libc_once = PTHREAD_ONCE_INIT;
void libc_init(void)
{
    glibc_resolve();
    if (tessera_real_dlsym == tessera_dlsym_unavailable || !tessera_real_dlmopen)
        th_log("cannot find glibc's dlsym/dlvsym/dlmopen; dynamic lookups will fail");
}
