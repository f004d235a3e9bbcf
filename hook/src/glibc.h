/* libtessera: glibc's own dlsym, dlvsym and dlmopen (glibc.c).  The library exports dlsym and
 * dlvsym itself (dlfcn_tramp.S), so these are found by walking libc's dynamic symbol table. */
#ifndef TESSERA_GLIBC_H
#define TESSERA_GLIBC_H

#include "hook.h"

#include <link.h>

#pragma GCC visibility push(hidden)

/* Code that may run before anything else is set up (a sanitizer runtime resolves its own
 * interceptors through our dlsym while it initialises): no instrumentation, no libc string
 * functions. */
#define NOSAN __attribute__((no_sanitize("address", "undefined"), noinline))

/* glibc's functions; until found, ones that find nothing (dlmopen: NULL). */
extern void *(*tessera_real_dlsym)(void *, const char *);
extern void *(*tessera_real_dlvsym)(void *, const char *, const char *);
extern void *(*tessera_real_dlmopen)(Lmid_t, const char *, int);

/* Find them (NOSAN: callable from the dlsym trampolines at any time). */
void glibc_resolve(void);
/* The same, once, logging when they cannot be found. */
extern pthread_once_t libc_once;
void libc_init(void);

/* A loaded object's dynamic symbol table, read through its GNU hash table. */
struct elf_index {
    ElfW(Addr) base;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Half) *versym;
    const ElfW(Addr) *bloom;
    const uint32_t *buckets, *chain;
    uint32_t nbuckets, symoff, nbloom, shift;
};
/* Index `m`'s table: 0 when it has none that elf_find can read (no GNU hash table). */
int elf_index(const struct link_map *m, struct elf_index *x);
/* The function `sym` the object itself defines (the default version), as dlsym would find it
 * there; NULL when the object does not define it as a plain function (dlsym may still find
 * it in a dependency, or an indirect function). */
void *elf_find(const struct elf_index *x, const char *sym);

/* strcmp(a, b) == 0, callable where glibc_resolve is. */
int glibc_streq(const char *a, const char *b);

#pragma GCC visibility pop
#endif
