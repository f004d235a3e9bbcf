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
        if ((c | 1) == (h | 1) && glibc_streq(strtab + symtab[i].st_name, sym) &&
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
