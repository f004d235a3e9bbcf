/* tprobe: the C test program the hook tests drive.  Linked directly against libcuda.so.1;
 * every entry point it exercises can instead be fetched through another lookup path.
 *
 *   tprobe [-m METHOD] OP ARGS...
 * METHOD (how hooked entry points are obtained):
 *   direct            the linked symbol
 *   dlsym | dlvsym    dlopen("libcuda.so.1") + dlsym / dlvsym(..., "ANY")
 *   next | default    dlsym(RTLD_NEXT / RTLD_DEFAULT, ...)
 *   dlmopen           dlmopen(LM_ID_NEWLM, "libcuda.so.1") + dlsym
 *   gpa:VER:FLAGS     cuGetProcAddress_v2(base name, VER, FLAGS)
 *   gpa1:VER:FLAGS    cuGetProcAddress (v1, via dlsym)
 *   nest:VER:FLAGS    cuGetProcAddress_v2 fetched through cuGetProcAddress_v2 itself
 *   libc              glibc's dlsym fetched with dlsym(RTLD_NEXT, "dlsym"), then used
 * OP:
 *   fill PATH CHUNK          allocate CHUNK-byte pieces until refused, free all; print
 *                            {"got","err","free_failures","held_after" (the view's used)}
 *   alloc PATH BYTES         one allocation; print {"err"}; free it
 *   hold PATH BYTES SECS     allocate, print "held", sleep, free
 *   churn PATH CHUNK SECS    allocate/free in a loop; on SIGUSR1, between an allocation's
 *                            free and the next allocation (holding nothing, inside no
 *                            driver call), print "paused" and sleep until killed
 *   info                     cuMemGetInfo_v2, cuDeviceTotalMem_v2, NVML memory info (JSON)
 *   launch N BLOCKS          N launches through each launch API in turn; print {"secs"}
 *   spin SECS MAXBLOCKS SEED launch kernels of random size for SECS; print {"launches"}
 *   fork PATH BYTES          the child allocates; print the child's {"err"}
 *   thread PATH BYTES        a thread without a current context allocates; print {"err"}
 *   exec OP ARGS...          re-exec with a scrubbed environment and run OP
 *   graphmem BYTES           graph memory nodes: cuGraphAddMemAllocNode, cuGraphAddNode(_v2)
 *                            with MEM_ALLOC and with KERNEL params, and a graph without
 *                            memory nodes instantiated and launched; print every {"err"}
 *   ctxs N                   create up to N contexts (cuCtxCreate by METHOD) until refused;
 *                            print {"created","err","used","used_after"} (used: view, in bytes)
 *   primary                  retain / release / reset the primary context; print the view's
 *                            used bytes after each step
 *   poolkeep BYTES KIND      async-allocate BYTES (KIND: default pool, or a pool that keeps
 *                            its memory on synchronisation), free it, allocate BYTES with
 *                            cuMemAlloc_v2 while the pool keeps them, after a sync, and after
 *                            cuMemPoolTrimTo; print every {"err"}
 * PATH: alloc pitch managed async pool vmm array array3d mipmap
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
/* Graph entry points a driver (the simulator) may lack: weak, so `direct` is the address the
 * dynamic linker bound (the preloaded hook's), or NULL. */
#pragma weak cuGraphAddMemAllocNode
#pragma weak cuGraphAddNode
#pragma weak cuGraphAddNode_v2

static const char *method = "direct";
static CUdevice dev;
static CUcontext ctx;

static void die(const char *what, CUresult r)
{
    printf("{\"fatal\": \"%s\", \"err\": %d}\n", what, (int)r);
    fflush(stdout);
    exit(3);
}

static volatile sig_atomic_t pause_requested;

static void on_pause_request(int sig)
{
    (void)sig;
    pause_requested = 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *base_of(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s", name);
    char *p;
    if ((p = strstr(buf, "_ptsz")) && !p[5])
        *p = 0;
    if ((p = strstr(buf, "_v2")) && !p[3])
        *p = 0;
    return buf;
}

typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);

/* Resolve a driver entry point by the chosen method.  `direct` is the linked address. */
static void *resolve(const char *name, void *direct)
{
    static void *h;
    char b[128];
    int ver = 0;
    unsigned long long fl = 0;
    if (!strcmp(method, "direct"))
        return direct;
    if (!strcmp(method, "dlsym") || !strcmp(method, "dlvsym")) {
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_NOW);
        return !strcmp(method, "dlsym") ? dlsym(h, name) : dlvsym(h, name, "ANY");
    }
    if (!strcmp(method, "next"))
        return dlsym(RTLD_NEXT, name);
    if (!strcmp(method, "default"))
        return dlsym(RTLD_DEFAULT, name);
    if (!strcmp(method, "dlmopen")) {
        if (!h)
            h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        return h ? dlsym(h, name) : NULL;
    }
    if (!strcmp(method, "libc")) {
        void *(*real)(void *, const char *) = (void *(*)(void *, const char *))dlsym(RTLD_NEXT, "dlsym");
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_NOW);
        return real(h, name);
    }
    if (sscanf(method, "gpa:%d:%llu", &ver, &fl) == 2) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult r = cuGetProcAddress(base_of(name, b, sizeof b), &p, ver, fl, &st);
        return r == CUDA_SUCCESS ? p : NULL;
    }
    if (sscanf(method, "gpa1:%d:%llu", &ver, &fl) == 2) {
        if (!h)
            h = dlopen("libcuda.so.1", RTLD_NOW);
        gpa1_t g = (gpa1_t)dlsym(h, "cuGetProcAddress");
        void *p = NULL;
        return g && g(base_of(name, b, sizeof b), &p, ver, fl) == CUDA_SUCCESS ? p : NULL;
    }
    if (sscanf(method, "nest:%d:%llu", &ver, &fl) == 2) {
        gpa2_t g = NULL;
        CUdriverProcAddressQueryResult st;
        if (cuGetProcAddress("cuGetProcAddress", (void **)&g, 12000, 0, &st) != CUDA_SUCCESS || !g)
            return NULL;
        void *p = NULL;
        return g(base_of(name, b, sizeof b), &p, ver, fl, &st) == CUDA_SUCCESS ? p : NULL;
    }
    fprintf(stderr, "unknown method %s\n", method);
    exit(2);
}

#define R(name) ((__typeof__(&name))resolve(#name, (void *)&name))

static void setup(void)
{
    CUresult r = cuInit(0);
    if (r)
        die("cuInit", r);
    if ((r = cuDeviceGet(&dev, 0)))
        die("cuDeviceGet", r);
    if ((r = cuDevicePrimaryCtxRetain(&ctx, dev)))
        die("cuDevicePrimaryCtxRetain", r);
    if ((r = cuCtxSetCurrent(ctx)))
        die("cuCtxSetCurrent", r);
}

/* One allocation through PATH; *handle gets what free_one needs. */
struct piece {
    CUdeviceptr p;
    CUmemGenericAllocationHandle h;
    CUarray a;
    CUmipmappedArray m;
    size_t n;
};

static CUresult alloc_one(const char *path, size_t n, struct piece *pc)
{
    memset(pc, 0, sizeof *pc);
    pc->n = n;
    if (!strcmp(path, "alloc")) {
        __typeof__(&cuMemAlloc_v2) f = R(cuMemAlloc_v2);
        return f ? f(&pc->p, n) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "managed")) {
        __typeof__(&cuMemAllocManaged) f = R(cuMemAllocManaged);
        return f ? f(&pc->p, n, CU_MEM_ATTACH_GLOBAL) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "pitch")) {
        __typeof__(&cuMemAllocPitch_v2) f = R(cuMemAllocPitch_v2);
        size_t pitch = 0;
        return f ? f(&pc->p, &pitch, 4096, n / 4096 ? n / 4096 : 1, 4) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "async")) {
        __typeof__(&cuMemAllocAsync) f = R(cuMemAllocAsync);
        return f ? f(&pc->p, n, NULL) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "pool")) {
        __typeof__(&cuMemAllocFromPoolAsync) f = R(cuMemAllocFromPoolAsync);
        CUmemoryPool pool;
        CUresult r = cuDeviceGetDefaultMemPool(&pool, dev);
        if (r)
            return r;
        return f ? f(&pc->p, n, pool, NULL) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "vmm")) {
        __typeof__(&cuMemCreate) f = R(cuMemCreate);
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev;
        if (!f)
            return CUDA_ERROR_NOT_FOUND;
        CUresult r = f(&pc->h, n, &prop, 0);
        if (r)
            return r;
        if ((r = cuMemAddressReserve(&pc->p, n, 0, 0, 0)))
            return r;
        if ((r = cuMemMap(pc->p, n, 0, pc->h, 0)))
            return r;
        return CUDA_SUCCESS;
    }
    if (!strcmp(path, "array")) {
        __typeof__(&cuArrayCreate_v2) f = R(cuArrayCreate_v2);
        CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096 ? n / 4096 : 1,
                                   .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        return f ? f(&pc->a, &d) : CUDA_ERROR_NOT_FOUND;
    }
    if (!strcmp(path, "array3d") || !strcmp(path, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096 ? n / 4096 : 1, .Depth = 0,
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
        if (!strcmp(path, "array3d")) {
            __typeof__(&cuArray3DCreate_v2) f = R(cuArray3DCreate_v2);
            return f ? f(&pc->a, &d) : CUDA_ERROR_NOT_FOUND;
        }
        __typeof__(&cuMipmappedArrayCreate) f = (__typeof__(&cuMipmappedArrayCreate))resolve("cuMipmappedArrayCreate", dlsym(RTLD_DEFAULT, "cuMipmappedArrayCreate"));
        return f ? f(&pc->m, &d, 1) : CUDA_ERROR_NOT_FOUND;
    }
    fprintf(stderr, "unknown path %s\n", path);
    exit(2);
}

static CUresult free_one(const char *path, struct piece *pc)
{
    if (!strcmp(path, "alloc") || !strcmp(path, "managed") || !strcmp(path, "pitch"))
        return R(cuMemFree_v2)(pc->p);
    if (!strcmp(path, "async") || !strcmp(path, "pool")) {
        CUresult r = R(cuMemFreeAsync)(pc->p, NULL);
        cuStreamSynchronize(NULL);
        return r;
    }
    if (!strcmp(path, "vmm")) {
        cuMemUnmap(pc->p, pc->n);
        cuMemAddressFree(pc->p, pc->n);
        return R(cuMemRelease)(pc->h);
    }
    if (!strcmp(path, "array") || !strcmp(path, "array3d"))
        return R(cuArrayDestroy)(pc->a);
    if (!strcmp(path, "mipmap"))
        { __typeof__(&cuMipmappedArrayDestroy) f = (__typeof__(&cuMipmappedArrayDestroy))resolve("cuMipmappedArrayDestroy", dlsym(RTLD_DEFAULT, "cuMipmappedArrayDestroy")); return f ? f(pc->m) : CUDA_ERROR_NOT_FOUND; }
    return CUDA_ERROR_INVALID_VALUE;
}

static int op_fill(const char *path, size_t chunk)
{
    size_t cap = 1 << 16, n = 0;
    struct piece *ps = calloc(cap, sizeof *ps);
    CUresult r = CUDA_SUCCESS;
    while (n < cap && (r = alloc_one(path, chunk, &ps[n])) == CUDA_SUCCESS)
        n++;
    size_t fails = 0;
    for (size_t i = 0; i < n; i++)
        fails += free_one(path, &ps[i]) != CUDA_SUCCESS;
    size_t f = 0, t = 0; /* what the (budgeted) view says is still held */
    CUresult ri = cuMemGetInfo_v2(&f, &t);
    printf("{\"got\": %zu, \"err\": %d, \"free_failures\": %zu, \"held_after\": %lld}\n",
           n * chunk, (int)r, fails, ri ? -1LL : (long long)(t - f));
    free(ps);
    return 0;
}

static void op_info(void)
{
    size_t f = 0, t = 0, tm = 0;
    CUresult r1 = R(cuMemGetInfo_v2)(&f, &t);
    CUresult r2 = R(cuDeviceTotalMem_v2)(&tm, dev);
    printf("{\"rc\": %d, \"free\": %zu, \"total\": %zu, \"rc_total\": %d, \"device_total\": %zu",
           (int)r1, f, t, (int)r2, tm);
    void *nv = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nv) {
        typedef struct { unsigned long long total, free, used; } mem1;
        int (*init)(void) = (int (*)(void))dlsym(nv, "nvmlInit_v2");
        int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(nv, "nvmlDeviceGetHandleByIndex_v2");
        int (*mi)(void *, mem1 *) = (int (*)(void *, mem1 *))dlsym(nv, "nvmlDeviceGetMemoryInfo");
        void *d = NULL;
        mem1 m = {0, 0, 0};
        if (init && get && mi && init() == 0 && get(0, &d) == 0 && mi(d, &m) == 0)
            printf(", \"nvml_total\": %llu, \"nvml_used\": %llu, \"nvml_free\": %llu", m.total, m.used, m.free);
        typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2;
        int (*mi2)(void *, mem2 *) = (int (*)(void *, mem2 *))dlsym(nv, "nvmlDeviceGetMemoryInfo_v2");
        mem2 m2 = {(unsigned int)(sizeof(mem2) | (2u << 24)), 0, 0, 0, 0};
        if (d && mi2 && mi2(d, &m2) == 0)
            printf(", \"nvml2_total\": %llu, \"nvml2_used\": %llu, \"nvml2_free\": %llu", m2.total, m2.used, m2.free);
    }
    printf("}\n");
}

static const char ptx[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n";

static CUfunction kernel(void)
{
    CUmodule m;
    CUfunction f;
    CUresult r = cuModuleLoadData(&m, ptx);
    if (r)
        die("cuModuleLoadData", r);
    if ((r = cuModuleGetFunction(&f, m, "k")))
        die("cuModuleGetFunction", r);
    return f;
}

static int op_launch(long n, unsigned blocks)
{
    CUfunction f = kernel();
    __typeof__(&cuLaunchKernel) lk = R(cuLaunchKernel);
    __typeof__(&cuLaunchKernelEx) lx = R(cuLaunchKernelEx);
    __typeof__(&cuLaunchCooperativeKernel) lc = R(cuLaunchCooperativeKernel);
    __typeof__(&cuGraphLaunch) lg = R(cuGraphLaunch);
    CUgraph g;
    CUgraphExec ge = NULL;
    CUDA_KERNEL_NODE_PARAMS kp = {.func = f, .gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1,
                                  .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
    CUgraphNode nd;
    if (cuGraphCreate(&g, 0) == CUDA_SUCCESS && cuGraphAddKernelNode(&nd, g, NULL, 0, &kp) == CUDA_SUCCESS)
        cuGraphInstantiateWithFlags(&ge, g, 0);
    CUlaunchConfig cfg = {.gridDimX = blocks, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                          .blockDimY = 1, .blockDimZ = 1};
    double t0 = now_s();
    long done = 0;
    CUresult r = CUDA_SUCCESS;
    for (long i = 0; i < n && r == CUDA_SUCCESS; i++, done++) {
        switch (i % 4) {
        case 0: r = lk ? lk(f, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) : CUDA_ERROR_NOT_FOUND; break;
        case 1: r = lx ? lx(&cfg, f, NULL, NULL) : CUDA_ERROR_NOT_FOUND; break;
        case 2: r = lc ? lc(f, blocks, 1, 1, 32, 1, 1, 0, NULL, NULL) : CUDA_ERROR_NOT_FOUND; break;
        default: r = (lg && ge) ? lg(ge, NULL) : CUDA_ERROR_NOT_FOUND; break;
        }
    }
    cuCtxSynchronize();
    printf("{\"secs\": %.6f, \"launches\": %ld, \"err\": %d}\n", now_s() - t0, done, (int)r);
    return 0;
}

static int op_spin(double secs, unsigned maxblocks, unsigned seed)
{
    CUfunction f = kernel();
    __typeof__(&cuLaunchKernel) lk = R(cuLaunchKernel);
    double end = now_s() + secs;
    long n = 0;
    srand(seed);
    while (now_s() < end) {
        unsigned b = 1 + (unsigned)rand() % maxblocks;
        if (lk(f, b, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) != CUDA_SUCCESS)
            break;
        n++;
    }
    cuCtxSynchronize();
    printf("{\"launches\": %ld}\n", n);
    return 0;
}

/* cuGraphAddNode by METHOD: through cuGetProcAddress the version picks the signature
 * (cuGraphAddNode from 12.2, cuGraphAddNode_v2 from 12.3); otherwise by name. */
static CUresult add_node(int v2, CUgraphNode *n, CUgraph g, CUgraphNodeParams *p)
{
    const char *colon = strchr(method, ':');
    if (colon)
        v2 = atoi(colon + 1) >= 12030;
    if (v2) {
        __typeof__(&cuGraphAddNode_v2) f = R(cuGraphAddNode_v2);
        return f ? f(n, g, NULL, NULL, 0, p) : CUDA_ERROR_NOT_FOUND;
    }
    __typeof__(&cuGraphAddNode) f = R(cuGraphAddNode);
    return f ? f(n, g, NULL, 0, p) : CUDA_ERROR_NOT_FOUND;
}

static int op_graphmem(size_t bytes)
{
    CUfunction f = kernel();
    CUgraph g;
    CUgraphNode nd;
    CUresult r = cuGraphCreate(&g, 0);
    if (r)
        die("cuGraphCreate", r);
    /* a memory allocation node, three ways */
    __typeof__(&cuGraphAddMemAllocNode) am = R(cuGraphAddMemAllocNode);
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = dev;
    ap.bytesize = bytes;
    CUresult e_alloc = am ? am(&nd, g, NULL, 0, &ap) : CUDA_ERROR_NOT_FOUND;
    CUgraphNodeParams np;
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
    np.alloc.poolProps = ap.poolProps;
    np.alloc.bytesize = bytes;
    CUresult e_node1 = add_node(0, &nd, g, &np);
    CUresult e_node2 = add_node(1, &nd, g, &np);
    /* any other node type passes through */
    CUgraph g2;
    if ((r = cuGraphCreate(&g2, 0)))
        die("cuGraphCreate", r);
    memset(&np, 0, sizeof np);
    np.type = CU_GRAPH_NODE_TYPE_KERNEL;
    np.kernel.func = f;
    np.kernel.gridDimX = np.kernel.gridDimY = np.kernel.gridDimZ = 1;
    np.kernel.blockDimX = 32;
    np.kernel.blockDimY = np.kernel.blockDimZ = 1;
    CUresult e_kernel = add_node(0, &nd, g2, &np);
    /* a graph without memory nodes: built, instantiated and launched as before */
    CUgraph g3;
    CUgraphExec ge = NULL;
    CUDA_KERNEL_NODE_PARAMS kp = {.func = f, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                  .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
    CUresult e_plain = cuGraphCreate(&g3, 0);
    if (!e_plain)
        e_plain = cuGraphAddKernelNode(&nd, g3, NULL, 0, &kp);
    if (!e_plain)
        e_plain = cuGraphInstantiateWithFlags(&ge, g3, 0);
    for (int i = 0; i < 3 && !e_plain; i++)
        e_plain = cuGraphLaunch(ge, NULL);
    if (!e_plain)
        e_plain = cuCtxSynchronize();
    if (ge)
        cuGraphExecDestroy(ge);
    cuGraphDestroy(g3);
    cuGraphDestroy(g2);
    cuGraphDestroy(g);
    size_t fr = 0, tot = 0;
    cuMemGetInfo_v2(&fr, &tot);
    printf("{\"alloc_node\": %d, \"add_node\": %d, \"add_node_v2\": %d, \"add_kernel_node\": %d, "
           "\"plain\": %d, \"used\": %zu}\n",
           (int)e_alloc, (int)e_node1, (int)e_node2, (int)e_kernel, (int)e_plain, tot - fr);
    return 0;
}

/* Bytes the container holds, as the (budgeted) view says. */
static size_t used_now(void)
{
    size_t f = 0, t = 0;
    return cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS ? t - f : (size_t)-1;
}

static int op_ctxs(int n)
{
    void *create = resolve("cuCtxCreate_v2", (void *)&cuCtxCreate_v2);
    CUcontext made[64];
    int k = 0;
    CUresult r = CUDA_SUCCESS;
    const char *colon = strchr(method, ':');
    int ver = colon ? atoi(colon + 1) : 0;
    while (k < n && k < 64 && r == CUDA_SUCCESS) {
        /* what cuGetProcAddress hands out for cuCtxCreate depends on the version asked */
        if (ver >= 12050) {
            __typeof__(&cuCtxCreate_v4) f = (__typeof__(&cuCtxCreate_v4))create;
            r = f ? f(&made[k], NULL, 0, dev) : CUDA_ERROR_NOT_FOUND;
        } else if (ver >= 11040) {
            __typeof__(&cuCtxCreate_v3) f = (__typeof__(&cuCtxCreate_v3))create;
            r = f ? f(&made[k], NULL, 0, 0, dev) : CUDA_ERROR_NOT_FOUND;
        } else {
            __typeof__(&cuCtxCreate_v2) f = (__typeof__(&cuCtxCreate_v2))create;
            r = f ? f(&made[k], 0, dev) : CUDA_ERROR_NOT_FOUND;
        }
        if (r == CUDA_SUCCESS)
            k++;
    }
    cuCtxSetCurrent(ctx);
    size_t used = used_now();
    __typeof__(&cuCtxDestroy_v2) destroy = R(cuCtxDestroy_v2);
    int bad = 0;
    for (int i = 0; i < k; i++)
        bad += !destroy || destroy(made[i]) != CUDA_SUCCESS;
    cuCtxSetCurrent(ctx);
    printf("{\"created\": %d, \"err\": %d, \"used\": %zu, \"used_after\": %zu, "
           "\"destroy_failures\": %d}\n", k, (int)r, used, used_now(), bad);
    return 0;
}

static int op_primary(void)
{
    CUcontext c2;
    size_t u0 = used_now();
    CUresult r1 = R(cuDevicePrimaryCtxRetain)(&c2, dev); /* refcount 2: the same context */
    size_t u1 = used_now();
    CUresult r2 = R(cuDevicePrimaryCtxRelease_v2)(dev);  /* refcount 1: still there */
    size_t u2 = used_now();
    CUresult r3 = R(cuDevicePrimaryCtxRelease_v2)(dev);  /* refcount 0: gone */
    CUresult r4 = R(cuDevicePrimaryCtxRetain)(&c2, dev); /* created again */
    cuCtxSetCurrent(c2);
    size_t u3 = used_now();
    CUresult r5 = R(cuDevicePrimaryCtxReset_v2)(dev);    /* gone, whatever the refcount */
    CUresult r6 = R(cuDevicePrimaryCtxRetain)(&c2, dev);
    cuCtxSetCurrent(c2);
    size_t u4 = used_now();
    printf("{\"err\": %d, \"used\": [%zu, %zu, %zu, %zu, %zu]}\n",
           (int)(r1 | r2 | r3 | r4 | r5 | r6), u0, u1, u2, u3, u4);
    return 0;
}

static int op_poolkeep(size_t n, const char *kind)
{
    CUmemoryPool pool = NULL;
    if (!strcmp(kind, "pool")) {
        CUmemPoolProps pp;
        memset(&pp, 0, sizeof pp);
        pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pp.location.id = dev;
        cuuint64_t keep = UINT64_MAX; /* keep everything across synchronisations */
        if (cuMemPoolCreate(&pool, &pp) || cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep))
            die("cuMemPoolCreate", CUDA_ERROR_UNKNOWN);
    }
    CUdeviceptr p, q;
    CUresult e_async = pool ? R(cuMemAllocFromPoolAsync)(&p, n, pool, NULL) : R(cuMemAllocAsync)(&p, n, NULL);
    CUresult e_free = e_async ? e_async : R(cuMemFreeAsync)(p, NULL);
    CUresult e_kept = R(cuMemAlloc_v2)(&q, n);
    if (!e_kept)
        cuMemFree_v2(q);
    cuStreamSynchronize(NULL);
    CUresult e_sync = R(cuMemAlloc_v2)(&q, n);
    if (!e_sync)
        cuMemFree_v2(q);
    CUresult e_trim = cuMemPoolTrimTo(pool ? pool : NULL, 0);
    if (!pool) {
        CUmemoryPool dp;
        e_trim = cuDeviceGetDefaultMemPool(&dp, dev) ? CUDA_ERROR_UNKNOWN : cuMemPoolTrimTo(dp, 0);
    }
    CUresult e_after = R(cuMemAlloc_v2)(&q, n);
    if (!e_after)
        cuMemFree_v2(q);
    printf("{\"async\": %d, \"free\": %d, \"while_kept\": %d, \"after_sync\": %d, "
           "\"trim\": %d, \"after_trim\": %d}\n",
           (int)e_async, (int)e_free, (int)e_kept, (int)e_sync, (int)e_trim, (int)e_after);
    return 0;
}

struct targ { const char *path; size_t n; CUresult r; };
static void *thread_fn(void *a_)
{
    struct targ *a = a_;
    struct piece pc;
    a->r = alloc_one(a->path, a->n, &pc);
    if (a->r == CUDA_SUCCESS)
        free_one(a->path, &pc);
    return NULL;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    if (argc > 2 && !strcmp(argv[1], "-m")) {
        method = argv[2];
        i = 3;
    }
    if (i >= argc)
        return 2;
    const char *op = argv[i];
    char **a = argv + i + 1;
    int na = argc - i - 1;
    if (!strcmp(op, "exec")) {
        /* a scrubbed environment that asks for more: only the simulator's location survives */
        char *env[] = {"LD_PRELOAD=", "TESSERA_MEMORY_LIMIT=1T", "TESSERA_LEDGER=/tmp/tprobe-other",
                       "LD_LIBRARY_PATH=", NULL, NULL, NULL};
        char nodev[4096], statev[4096];
        int ne = 4;
        if (getenv("TESSERA_SIM_NODE")) {
            snprintf(nodev, sizeof nodev, "TESSERA_SIM_NODE=%s", getenv("TESSERA_SIM_NODE"));
            env[ne++] = nodev;
        }
        if (getenv("TESSERA_SIM_STATE")) {
            snprintf(statev, sizeof statev, "TESSERA_SIM_STATE=%s", getenv("TESSERA_SIM_STATE"));
            env[ne++] = statev;
        }
        const char *ld = getenv("LD_LIBRARY_PATH");
        char buf[4096];
        snprintf(buf, sizeof buf, "LD_LIBRARY_PATH=%s", ld ? ld : "");
        env[3] = buf;
        char **nargv = calloc((size_t)argc + 4, sizeof *nargv);
        int k = 0;
        nargv[k++] = argv[0];
        nargv[k++] = "-m";
        nargv[k++] = (char *)method;
        for (int j = 0; j < na; j++)
            nargv[k++] = a[j];
        execve("/proc/self/exe", nargv, env);
        perror("execve");
        return 2;
    }
    setup();
    if (!strcmp(op, "fill") && na >= 2)
        return op_fill(a[0], strtoull(a[1], NULL, 0));
    if (!strcmp(op, "alloc") && na >= 2) {
        struct piece pc;
        CUresult r = alloc_one(a[0], strtoull(a[1], NULL, 0), &pc);
        printf("{\"err\": %d}\n", (int)r);
        if (r == CUDA_SUCCESS)
            free_one(a[0], &pc);
        return 0;
    }
    if (!strcmp(op, "hold") && na >= 3) {
        struct piece pc;
        CUresult r = alloc_one(a[0], strtoull(a[1], NULL, 0), &pc);
        printf(r == CUDA_SUCCESS ? "held\n" : "{\"err\": %d}\n", (int)r);
        fflush(stdout);
        usleep((useconds_t)(atof(a[2]) * 1e6));
        if (r == CUDA_SUCCESS)
            free_one(a[0], &pc);
        return 0;
    }
    if (!strcmp(op, "churn") && na >= 3) {
        size_t n = strtoull(a[1], NULL, 0);
        double end = now_s() + atof(a[2]);
        long ok = 0, refused = 0;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_pause_request;
        if (sigaction(SIGUSR1, &sa, NULL) != 0) {
            perror("sigaction");
            return 1;
        }
        printf("started\n");
        fflush(stdout);
        while (now_s() < end) {
            if (pause_requested) {
                printf("paused\n");
                fflush(stdout);
                for (;;)
                    pause();
            }
            struct piece pc;
            if (alloc_one(a[0], n, &pc) == CUDA_SUCCESS) {
                ok++;
                free_one(a[0], &pc);
            } else {
                refused++;
            }
        }
        printf("{\"ok\": %ld, \"refused\": %ld}\n", ok, refused);
        return 0;
    }
    if (!strcmp(op, "info")) {
        op_info();
        return 0;
    }
    if (!strcmp(op, "launch") && na >= 2)
        return op_launch(atol(a[0]), (unsigned)atoi(a[1]));
    if (!strcmp(op, "graphmem") && na >= 1)
        return op_graphmem(strtoull(a[0], NULL, 0));
    if (!strcmp(op, "ctxs") && na >= 1)
        return op_ctxs(atoi(a[0]));
    if (!strcmp(op, "primary"))
        return op_primary();
    if (!strcmp(op, "poolkeep") && na >= 2)
        return op_poolkeep(strtoull(a[0], NULL, 0), a[1]);
    if (!strcmp(op, "spin") && na >= 3)
        return op_spin(atof(a[0]), (unsigned)atoi(a[1]), (unsigned)atoi(a[2]));
    if (!strcmp(op, "fork") && na >= 2) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            struct piece pc;
            CUresult r = alloc_one(a[0], strtoull(a[1], NULL, 0), &pc);
            printf("{\"err\": %d}\n", (int)r);
            fflush(stdout);
            _exit(0);
        }
        int st;
        waitpid(p, &st, 0);
        return 0;
    }
    if (!strcmp(op, "thread") && na >= 2) {
        cuCtxSetCurrent(NULL);
        struct targ t = {a[0], strtoull(a[1], NULL, 0), CUDA_SUCCESS};
        pthread_t th;
        pthread_create(&th, NULL, thread_fn, &t);
        pthread_join(th, NULL);
        printf("{\"err\": %d}\n", (int)t.r);
        return 0;
    }
    if (!strcmp(op, "repl")) {
        /* lines: "alloc PATH BYTES" (kept) | "free" (all) | "info" | "launch N" | "quit" */
        char line[256];
        struct piece *ps = calloc(4096, sizeof *ps);
        char paths[4096][16];
        size_t n = 0;
        CUfunction f = NULL;
        printf("ready\n");
        while (fgets(line, sizeof line, stdin)) {
            char p[16];
            unsigned long long b;
            long k;
            if (sscanf(line, "alloc %15s %llu", p, &b) == 2) {
                CUresult r = n < 4096 ? alloc_one(p, b, &ps[n]) : CUDA_ERROR_INVALID_VALUE;
                if (r == CUDA_SUCCESS)
                    snprintf(paths[n++], 16, "%s", p);
                printf("{\"err\": %d}\n", (int)r);
            } else if (!strncmp(line, "free", 4)) {
                while (n > 0) {
                    n--;
                    free_one(paths[n], &ps[n]);
                }
                printf("{\"freed\": 1}\n");
            } else if (!strncmp(line, "info", 4)) {
                op_info();
            } else if (sscanf(line, "launch %ld", &k) == 1) {
                if (!f)
                    f = kernel();
                double t0 = now_s();
                for (long j = 0; j < k; j++)
                    cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
                printf("{\"secs\": %.6f}\n", now_s() - t0);
            } else {
                break;
            }
        }
        return 0;
    }
    fprintf(stderr, "bad arguments\n");
    return 2;
}
