/* Fake libcuda.so.1: one process's driver state -- its devices, the registries that say
 * which handles are live, and the record of every allocation (see cuda_core.h).  The entry
 * points are in the other cuda_*.c files, one file per part of the driver API. */
#include "cuda_core.h"

#include <string.h>

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
int g_initialized;
CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
struct sim_dev g_dev[SIM_MAX_DEVS];
int g_ndev;
unsigned long long g_next_id = 1;

/* ------------------------------------------------------------- handle registry */

struct reg r_ctx, r_stream, r_event, r_mod, r_func, r_pool, r_graph, r_gexec, r_node, r_lib, r_kern;

int reg_add(struct reg *r, void *p)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        void **ni = realloc(r->items, cap * sizeof *ni);
        if (!ni)
            return -1;
        r->items = ni;
        r->cap = cap;
    }
    r->items[r->n++] = p;
    return 0;
}

/* ------------------------------------------------------------- allocations */

struct alloc *g_alloc;
size_t g_nalloc;
static size_t g_capalloc;

struct alloc *alloc_add(void)
{
    if (g_nalloc == g_capalloc) {
        size_t cap = g_capalloc ? g_capalloc * 2 : 256;
        struct alloc *na = realloc(g_alloc, cap * sizeof *na);
        if (!na)
            return NULL;
        g_alloc = na;
        g_capalloc = cap;
    }
    struct alloc *a = &g_alloc[g_nalloc++];
    memset(a, 0, sizeof *a);
    return a;
}

struct alloc *alloc_containing(uintptr_t p, size_t n)
{
    for (size_t i = 0; i < g_nalloc; i++) {
        struct alloc *a = &g_alloc[i];
        if (a->kind == A_VMM_HANDLE || a->kind == A_ARRAY || a->kind == A_MIPMAP)
            continue;
        if (p >= a->ptr && p - a->ptr <= a->size && n <= a->size - (p - a->ptr))
            return a;
    }
    return NULL;
}
