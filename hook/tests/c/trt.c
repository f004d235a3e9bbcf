/* trt: a CUDA runtime-API program, built against the real libcudart of the pinned
 * nvidia-cuda-runtime-cu12 wheel and run on the simulated node under libtessera.  Its
 * kernels are PTX (trt_kernels.ptx) packed into a fat binary and registered with the runtime
 * as nvcc's host stub does (sim/tools/fatbin.py -> build/trt_kernels.c).  Every OP prints
 * one JSON line; cudaError_t values are numbers.
 *
 *   trt info                       devices, cudaMemGetInfo and cudaDeviceProp's memory
 *   trt fill KIND CHUNK            allocate CHUNK-byte pieces until refused, free them all:
 *                                  {"got","err","free_err","after"} (after: used once freed)
 *                                  KIND: malloc managed async pool pitch
 *   trt poolkeep BYTES             the default pool keeps BYTES freed by cudaFreeAsync (release
 *                                  threshold: all): cudaMalloc of BYTES while it keeps them,
 *                                  after cudaMemPoolTrimTo(0): {"kept_err","trimmed_err"}
 *   trt threshold BYTES KEEP       the default pool's release threshold KEEP: BYTES allocated
 *                                  with cudaMallocAsync, freed, synchronised: {"used"} (the
 *                                  budget's view: what the pool still keeps)
 *   trt launch DEV N BLOCKS        N cudaLaunchKernel of BLOCKS blocks on device DEV: {"secs"}
 *   trt graph N NODES              capture NODES launches from a stream into a graph,
 *                                  instantiate it, launch it N times: {"err","secs","nodes"}
 *   trt devices CHUNK              fill (cudaMalloc) on every device in turn: {"got":[...]}
 *   trt threads T CHUNK            T threads allocate CHUNK pieces at once until refused:
 *                                  {"got"} (all threads together), then free
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void tessera_kernel_spin(void); /* build/trt_kernels.c */

#define MAX_PIECES 65536

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static size_t used_bytes(void)
{
    size_t free_b = 0, total = 0;
    return cudaMemGetInfo(&free_b, &total) == cudaSuccess ? total - free_b : (size_t)-1;
}

static int op_info(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    size_t free_b = 0, total = 0;
    cudaError_t e2 = e == cudaSuccess ? cudaMemGetInfo(&free_b, &total) : e;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    cudaError_t e3 = e == cudaSuccess ? cudaGetDeviceProperties(&prop, 0) : e;
    printf("{\"err\": %d, \"devices\": %d, \"info_err\": %d, \"free\": %zu, \"total\": %zu, "
           "\"prop_err\": %d, \"prop_total\": %zu, \"name\": \"%s\"}\n",
           e, n, e2, free_b, total, e3, prop.totalGlobalMem, prop.name);
    return 0;
}

/* One allocation of `kind`; *p is what to free. */
static cudaError_t alloc_one(const char *kind, size_t chunk, void **p, cudaStream_t s, cudaMemPool_t pool)
{
    if (!strcmp(kind, "malloc"))
        return cudaMalloc(p, chunk);
    if (!strcmp(kind, "managed"))
        return cudaMallocManaged(p, chunk, cudaMemAttachGlobal);
    if (!strcmp(kind, "async"))
        return cudaMallocAsync(p, chunk, s);
    if (!strcmp(kind, "pool"))
        return cudaMallocFromPoolAsync(p, chunk, pool, s);
    if (!strcmp(kind, "pitch")) {
        size_t pitch = 0;
        return cudaMallocPitch(p, &pitch, chunk / 1024, 1024);
    }
    return cudaErrorInvalidValue;
}

static cudaError_t free_one(const char *kind, void *p, cudaStream_t s)
{
    if (!strcmp(kind, "async") || !strcmp(kind, "pool"))
        return cudaFreeAsync(p, s);
    return cudaFree(p);
}

static int op_fill(const char *kind, size_t chunk)
{
    static void *pieces[MAX_PIECES];
    cudaStream_t s = NULL;
    cudaMemPool_t pool = NULL;
    cudaError_t e = cudaStreamCreate(&s);
    if (e == cudaSuccess && !strcmp(kind, "pool")) {
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        e = cudaMemPoolCreate(&pool, &props);
        uint64_t keep = UINT64_MAX; /* keep everything freed: the budget must still count it */
        if (e == cudaSuccess)
            e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    }
    if (e != cudaSuccess) {
        printf("{\"setup_err\": %d}\n", e);
        return 1;
    }
    size_t n = 0;
    while (n < MAX_PIECES && (e = alloc_one(kind, chunk, &pieces[n], s, pool)) == cudaSuccess)
        n++;
    cudaGetLastError(); /* the refusal is sticky-free, but clear it */
    cudaError_t free_err = cudaSuccess;
    for (size_t i = 0; i < n; i++) {
        cudaError_t f = free_one(kind, pieces[i], s);
        if (f != cudaSuccess)
            free_err = f;
    }
    cudaStreamSynchronize(s);
    if (pool) {
        cudaMemPoolTrimTo(pool, 0);
        cudaMemPoolDestroy(pool);
    }
    printf("{\"got\": %zu, \"err\": %d, \"free_err\": %d, \"after\": %zu}\n", n * chunk, e, free_err,
           used_bytes());
    return 0;
}

static int op_poolkeep(size_t bytes)
{
    cudaMemPool_t pool = NULL;
    cudaStream_t s = NULL;
    void *p = NULL, *q = NULL;
    uint64_t keep = UINT64_MAX;
    cudaError_t e = cudaStreamCreate(&s);
    if (e == cudaSuccess)
        e = cudaDeviceGetDefaultMemPool(&pool, 0);
    if (e == cudaSuccess)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&p, bytes, s);
    if (e == cudaSuccess)
        e = cudaFreeAsync(p, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        printf("{\"setup_err\": %d}\n", e);
        return 1;
    }
    cudaError_t kept = cudaMalloc(&q, bytes);
    if (kept == cudaSuccess)
        cudaFree(q);
    cudaGetLastError();
    cudaMemPoolTrimTo(pool, 0);
    cudaError_t trimmed = cudaMalloc(&q, bytes);
    if (trimmed == cudaSuccess)
        cudaFree(q);
    printf("{\"kept_err\": %d, \"trimmed_err\": %d}\n", kept, trimmed);
    return 0;
}

static int op_threshold(size_t bytes, uint64_t keep)
{
    cudaMemPool_t pool = NULL;
    cudaStream_t s = NULL;
    void *p = NULL;
    cudaError_t e = cudaStreamCreate(&s);
    if (e == cudaSuccess)
        e = cudaDeviceGetDefaultMemPool(&pool, 0);
    if (e == cudaSuccess)
        e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e == cudaSuccess)
        e = cudaMallocAsync(&p, bytes, s);
    size_t held = used_bytes();
    if (e == cudaSuccess)
        e = cudaFreeAsync(p, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    printf("{\"err\": %d, \"held\": %zu, \"used\": %zu}\n", e, held, used_bytes());
    return 0;
}

static cudaError_t spin(unsigned blocks, cudaStream_t s)
{
    dim3 grid = {blocks, 1, 1}, block = {128, 1, 1};
    void *none = NULL;
    void *args[] = {&none};
    return cudaLaunchKernel((const void *)tessera_kernel_spin, grid, block, args, 0, s);
}

static int op_launch(int dev, int n, unsigned blocks)
{
    cudaError_t e = cudaSetDevice(dev);
    double t0 = now();
    for (int i = 0; i < n && e == cudaSuccess; i++)
        e = spin(blocks, NULL);
    if (e == cudaSuccess)
        e = cudaDeviceSynchronize();
    printf("{\"err\": %d, \"secs\": %.4f}\n", e, now() - t0);
    return 0;
}

static int op_graph(int n, int nodes)
{
    cudaStream_t s = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    size_t count = 0;
    cudaError_t e = cudaStreamCreate(&s);
    if (e == cudaSuccess)
        e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < nodes && e == cudaSuccess; i++)
        e = spin(1, s);
    if (e == cudaSuccess)
        e = cudaStreamEndCapture(s, &g);
    if (e == cudaSuccess)
        e = cudaGraphGetNodes(g, NULL, &count);
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&x, g, 0);
    double t0 = now();
    for (int i = 0; i < n && e == cudaSuccess; i++)
        e = cudaGraphLaunch(x, s);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(s);
    printf("{\"err\": %d, \"secs\": %.4f, \"nodes\": %zu}\n", e, now() - t0, count);
    return 0;
}

static int op_devices(size_t chunk)
{
    static void *pieces[MAX_PIECES];
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    printf("{\"err\": %d, \"got\": [", e);
    for (int d = 0; d < ndev; d++) {
        size_t n = 0;
        cudaSetDevice(d);
        while (n < MAX_PIECES && cudaMalloc(&pieces[n], chunk) == cudaSuccess)
            n++;
        cudaGetLastError();
        for (size_t i = 0; i < n; i++)
            cudaFree(pieces[i]);
        printf("%s%zu", d ? ", " : "", n * chunk);
    }
    printf("]}\n");
    return 0;
}

struct filler {
    size_t chunk, got;
    void **pieces;
};

static void *fill_thread(void *arg)
{
    struct filler *f = arg;
    size_t n = 0;
    while (n < 4096 && cudaMalloc(&f->pieces[n], f->chunk) == cudaSuccess)
        n++;
    f->got = n;
    return NULL;
}

static int op_threads(int t, size_t chunk)
{
    pthread_t th[64];
    struct filler f[64];
    if (t < 1 || t > 64)
        return 2;
    cudaFree(NULL); /* the context, before the threads race */
    for (int i = 0; i < t; i++) {
        f[i] = (struct filler){chunk, 0, calloc(4096, sizeof(void *))};
        pthread_create(&th[i], NULL, fill_thread, &f[i]);
    }
    size_t got = 0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        got += f[i].got * chunk;
    }
    size_t held = used_bytes();
    for (int i = 0; i < t; i++) {
        for (size_t j = 0; j < f[i].got; j++)
            cudaFree(f[i].pieces[j]);
        free(f[i].pieces);
    }
    printf("{\"got\": %zu, \"held\": %zu, \"after\": %zu}\n", got, held, used_bytes());
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: trt OP ARGS... (see the comment at the top of trt.c)\n");
        return 2;
    }
    const char *op = argv[1];
    if (!strcmp(op, "info"))
        return op_info();
    if (!strcmp(op, "fill") && argc == 4)
        return op_fill(argv[2], strtoull(argv[3], NULL, 0));
    if (!strcmp(op, "poolkeep") && argc == 3)
        return op_poolkeep(strtoull(argv[2], NULL, 0));
    if (!strcmp(op, "threshold") && argc == 4)
        return op_threshold(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
    if (!strcmp(op, "launch") && argc == 5)
        return op_launch(atoi(argv[2]), atoi(argv[3]), (unsigned)atoi(argv[4]));
    if (!strcmp(op, "graph") && argc == 4)
        return op_graph(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(op, "devices") && argc == 3)
        return op_devices(strtoull(argv[2], NULL, 0));
    if (!strcmp(op, "threads") && argc == 4)
        return op_threads(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    fprintf(stderr, "trt: unknown operation or wrong arguments: %s\n", op);
    return 2;
}
