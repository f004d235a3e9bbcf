/* tbench: micro-benchmarks for bench/hook.py.
 *   tbench alloc N SIZE   N x cuMemAlloc_v2 (kept until exit)
 *   tbench launch N       N x cuLaunchKernel
 *   tbench lat N SIZE     N x (cuMemAlloc_v2 + cuMemFree_v2); prints alloc latency p50/p99 (us)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    CUdevice d;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&d, 0) || cuDevicePrimaryCtxRetain(&c, d) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "no device\n");
        return 3;
    }
    long n = atol(argv[2]);
    if (!strcmp(argv[1], "alloc") && argc > 3) {
        size_t sz = strtoull(argv[3], NULL, 0);
        CUdeviceptr p;
        for (long i = 0; i < n; i++)
            if (cuMemAlloc_v2(&p, sz))
                return 4;
        return 0;
    }
    if (!strcmp(argv[1], "launch")) {
        static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n";
        CUmodule m;
        CUfunction f;
        if (cuModuleLoadData(&m, ptx) || cuModuleGetFunction(&f, m, "k"))
            return 4;
        for (long i = 0; i < n; i++)
            if (cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
                return 4;
        return 0;
    }
    if (!strcmp(argv[1], "lat") && argc > 3) {
        size_t sz = strtoull(argv[3], NULL, 0);
        double *t = calloc((size_t)n, sizeof *t);
        CUdeviceptr p;
        for (long i = 0; i < n; i++) {
            double t0 = now_us();
            if (cuMemAlloc_v2(&p, sz))
                return 4;
            t[i] = now_us() - t0;
            cuMemFree_v2(p);
        }
        qsort(t, (size_t)n, sizeof *t, cmp);
        printf("{\"p50_us\": %.3f, \"p99_us\": %.3f}\n", t[n / 2], t[(n * 99) / 100]);
        return 0;
    }
    return 2;
}
