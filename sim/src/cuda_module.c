/* Fake libcuda.so.1: modules and functions.  A module image is the simulator's own
 * description of its kernels and what each costs, or PTX text (every .entry a kernel of the
 * node's default cost), or a fat binary carrying PTX (what nvcc embeds in a program and the
 * CUDA runtime loads); machine code alone (cubin, a fatbin without PTX) is refused: none runs
 * here. */
#include "cuda_core.h"
#include "fatbin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parse a module image.  Two forms:
 *   the simulator's own:  first line ".tessera_sim_module", then lines
 *       kernel NAME [ns_per_block=N] [fixed_ns=N] [cost_param=I]
 *   PTX text: every ".entry NAME" becomes a kernel with the node's default cost. */
static CUresult parse_module(const char *img, size_t len, CUmodule m)
{
    struct sim_kernel ks[256];
    int n = 0;
    uint64_t dflt = sim_state()->default_ns_per_block;
    if (len >= 4 && memcmp(img, "\177ELF", 4) == 0)
        return CUDA_ERROR_INVALID_IMAGE; /* cubin/fatbin: no machine code runs here */
    char *text = strndup(img, len);
    if (!text)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int own = strncmp(text, ".tessera_sim_module", 19) == 0;
    int ptx = strstr(text, ".entry") != NULL;
    CUresult rc = (own || ptx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_IMAGE;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); rc == CUDA_SUCCESS && line; line = strtok_r(NULL, "\n", &save)) {
        struct sim_kernel k = {.ns_per_block = dflt, .cost_param = -1};
        if (own) {
            char *tok_save = NULL;
            char *tok = strtok_r(line, " \t\r", &tok_save);
            if (!tok || strcmp(tok, "kernel") != 0)
                continue;
            tok = strtok_r(NULL, " \t\r", &tok_save);
            if (!tok) {
                rc = CUDA_ERROR_INVALID_IMAGE;
                break;
            }
            sim_copy_str(k.name, sizeof k.name, tok);
            while ((tok = strtok_r(NULL, " \t\r", &tok_save))) {
                unsigned long long v = 0;
                int iv = 0;
                if (sscanf(tok, "ns_per_block=%llu", &v) == 1)
                    k.ns_per_block = v;
                else if (sscanf(tok, "fixed_ns=%llu", &v) == 1)
                    k.fixed_ns = v;
                else if (sscanf(tok, "cost_param=%d", &iv) == 1 && iv >= 0 && iv < 64)
                    k.cost_param = iv;
                else
                    rc = CUDA_ERROR_INVALID_IMAGE;
            }
        } else {
            char *p = strstr(line, ".entry");
            if (!p)
                continue;
            p += 6;
            while (*p == ' ' || *p == '\t')
                p++;
            size_t l = strcspn(p, " \t(\r{");
            if (l == 0 || l >= sizeof k.name) {
                rc = CUDA_ERROR_INVALID_PTX;
                break;
            }
            memcpy(k.name, p, l);
            k.name[l] = '\0';
        }
        if (n >= 256) {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        ks[n++] = k;
    }
    free(text);
    if (rc != CUDA_SUCCESS)
        return rc;
    m->funcs = calloc((size_t)(n ? n : 1), sizeof *m->funcs);
    if (!m->funcs)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        m->funcs[i].magic = MAGIC_FUNC;
        m->funcs[i].mod = m;
        m->funcs[i].k = ks[i];
        if (reg_add(&r_func, &m->funcs[i]) != 0) {
            for (int j = 0; j < i; j++)
                reg_del(&r_func, &m->funcs[j]);
            free(m->funcs);
            m->funcs = NULL;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    m->nfuncs = n;
    return CUDA_SUCCESS;
}

CUresult module_load_locked(CUcontext c, const char *img, size_t len, CUmodule *pm)
{
    CUmodule m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MAGIC_MOD;
    m->ctx = c;
    CUresult rc = parse_module(img, len, m);
    if (rc == CUDA_SUCCESS && reg_add(&r_mod, m) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS) {
        *pm = m;
        return rc;
    }
    for (int i = 0; i < m->nfuncs; i++)
        reg_del(&r_func, &m->funcs[i]);
    free(m->funcs);
    free(m);
    return rc;
}

static CUresult module_load(CUmodule *pm, const char *img, size_t len)
{
    pthread_mutex_lock(&g_mu);
    CUcontext c = NULL;
    CUresult rc = need_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = module_load_locked(c, img, len, pm);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

CUresult module_image(const void *image, const char **text, size_t *len)
{
    switch (fatbin_ptx(image, SIZE_MAX, text, len)) {
    case FATBIN_PTX:
        return CUDA_SUCCESS;
    case FATBIN_NOT_FATBIN:
        break;
    case FATBIN_MALFORMED:
        return CUDA_ERROR_INVALID_IMAGE;
    case FATBIN_NO_PTX:
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    case FATBIN_COMPRESSED:
        return CUDA_ERROR_NOT_SUPPORTED; /* the simulator reads uncompressed PTX only */
    case FATBIN_BAD_PTX_HEADER:
        return CUDA_ERROR_INVALID_PTX; /* as the real driver's JIT answers it */
    }
    *text = image;
    *len = memcmp(image, "\177ELF", 4) == 0 ? 4 : strlen(image);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoadData(CUmodule *pm, const void *image)
{
    ENTER();
    if (!pm || !image)
        return CUDA_ERROR_INVALID_VALUE;
    const char *img = NULL;
    size_t len = 0;
    CUresult rc = module_image(image, &img, &len);
    return rc == CUDA_SUCCESS ? module_load(pm, img, len) : rc;
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *pm, const void *image, unsigned int n, CUjit_option *o, void **v)
{
    (void)n;
    (void)o;
    (void)v;
    return cuModuleLoadData(pm, image);
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule *pm, const void *image) { return cuModuleLoadData(pm, image); }

EXPORT CUresult cuModuleLoad(CUmodule *pm, const char *fname)
{
    ENTER();
    if (!pm || !fname)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = open(fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_FILE_NOT_FOUND;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0 || sb.st_size > (1 << 26)) {
        close(fd);
        return CUDA_ERROR_INVALID_IMAGE;
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (buf && got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!buf)
        return CUDA_ERROR_OUT_OF_MEMORY;
    buf[got] = '\0';
    CUresult rc = module_load(pm, buf, got);
    free(buf);
    return rc;
}

void module_free(CUmodule m)
{
    for (int i = 0; i < m->nfuncs; i++) {
        reg_del(&r_func, &m->funcs[i]);
        m->funcs[i].magic = 0;
    }
    reg_del(&r_mod, m);
    free(m->funcs);
    m->magic = 0;
    free(m);
}

EXPORT CUresult cuModuleUnload(CUmodule m)
{
    ENTER();
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_mod, m) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_SUCCESS)
        module_free(m);
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *pf, CUmodule m, const char *name)
{
    ENTER();
    if (!pf || !name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_mod, m) ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_INVALID_HANDLE;
    if (rc == CUDA_ERROR_NOT_FOUND)
        for (int i = 0; i < m->nfuncs; i++)
            if (strcmp(m->funcs[i].k.name, name) == 0) {
                *pf = &m->funcs[i];
                rc = CUDA_SUCCESS;
                break;
            }
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute a, CUfunction f)
{
    ENTER();
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *pi = 80; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = 80; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 49152; break;
    default:
        if ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX)
            return CUDA_ERROR_INVALID_VALUE;
        *pi = 0;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{
    ENTER();
    (void)v;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS && ((int)a < 0 || a >= CU_FUNC_ATTRIBUTE_MAX))
        rc = CUDA_ERROR_INVALID_VALUE;
    return rc;
}

EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, CUfunc_cache c)
{
    ENTER();
    (void)c;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    return rc;
}

EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs, size_t shm)
{
    ENTER();
    if (!n || bs <= 0 || bs > 1024 || shm > 49152)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult rc = reg_has(&r_func, f) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_unlock(&g_mu);
    if (rc == CUDA_SUCCESS)
        *n = max_blocks_per_sm(bs);
    return rc;
}

/* Modules load when they are loaded: what the runtime asks before it registers kernels. */
EXPORT CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = CU_MODULE_EAGER_LOADING;
    return CUDA_SUCCESS;
}
