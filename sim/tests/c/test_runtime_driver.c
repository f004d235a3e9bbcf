/* What the CUDA runtime asks of the driver, tested at the driver API: fat binaries (PTX
 * loaded, machine code alone or compressed PTX refused, a malformed one refused, nvcc's
 * wrapper followed), libraries and kernels (a CUkernel launched as a CUfunction), stream
 * capture, the private export tables, and MD2 (RFC 1319's test vectors). */
#include <cuda.h>
#include <stdint.h>
#include <string.h>

#include "../../src/md2.c" /* pure: its test vectors, without exporting it from libcuda */
#include "check.h"

static const char PTX[] = ".version 8.0\n.target sm_80\n.address_size 64\n"
                          ".visible .entry first(.param .u64 p)\n{\n ret;\n}\n"
                          ".visible .entry second(.param .u64 p)\n{\n ret;\n}\n";

/* An entry's header as nvcc 13 writes one (--compress-mode=none), read off a real fatbin. */
struct entry {
    uint16_t kind, version;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size, address_bits;
    uint16_t isa_minor, isa_major;
    uint32_t sm, name_offset, name_len;
    uint64_t flags, reserved, uncompressed_size, tail[2];
};

/* A fat binary of one entry: kind 1 (PTX) or 2 (ELF), flags (0x8000: Zstandard), the PTX
 * ISA major version its header states (0: none, as the real driver's JIT refuses). */
static size_t make_fatbin_isa(unsigned char *out, uint16_t kind, uint64_t flags, const void *payload, size_t n,
                              uint16_t isa_major)
{
    size_t padded = (n + 7) & ~(size_t)7;
    struct entry e = {kind, 0x0101, sizeof e, padded, 0, 64, 0, isa_major, 80, 0, 0, flags, 0, 0, {0, 0}};
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, hsize = 16;
    uint64_t body = sizeof e + padded;
    memcpy(out, &magic, 4);
    memcpy(out + 4, &version, 2);
    memcpy(out + 6, &hsize, 2);
    memcpy(out + 8, &body, 8);
    memcpy(out + 16, &e, sizeof e);
    memset(out + 16 + sizeof e, 0, padded);
    memcpy(out + 16 + sizeof e, payload, n);
    return 16 + body;
}

static size_t make_fatbin(unsigned char *out, uint16_t kind, uint64_t flags, const void *payload, size_t n)
{
    return make_fatbin_isa(out, kind, flags, payload, n, 8);
}

static void test_fatbins(void)
{
    static unsigned char fb[4096] __attribute__((aligned(8)));
    CUmodule m;
    CUfunction f;
    make_fatbin(fb, 1, 0x11, PTX, sizeof PTX);
    CHECK_EQ(cuModuleLoadData(&m, fb), CUDA_SUCCESS);
    CHECK_EQ(cuModuleGetFunction(&f, m, "second"), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuModuleUnload(m), CUDA_SUCCESS);

    struct { int magic, version; const void *data; void *unused; } wrapper = {(int)0x466243B1u, 1, fb, NULL};
    CHECK_EQ(cuModuleLoadData(&m, &wrapper), CUDA_SUCCESS);
    CHECK_EQ(cuModuleUnload(m), CUDA_SUCCESS);

    make_fatbin(fb, 2, 0x11, "\177ELF....", 8);
    CHECK_EQ(cuModuleLoadData(&m, fb), CUDA_ERROR_NO_BINARY_FOR_GPU);
    make_fatbin(fb, 1, 0x8011, PTX, sizeof PTX);
    CHECK_EQ(cuModuleLoadData(&m, fb), CUDA_ERROR_NOT_SUPPORTED);
    make_fatbin_isa(fb, 1, 0x11, PTX, sizeof PTX, 0); /* no ISA version in the header */
    CHECK_EQ(cuModuleLoadData(&m, fb), CUDA_ERROR_INVALID_PTX);
    make_fatbin(fb, 1, 0x11, PTX, sizeof PTX);
    uint32_t huge = 1u << 30; /* an entry claiming more than its container holds */
    memcpy(fb + 16 + 8, &huge, 4);
    CHECK_EQ(cuModuleLoadData(&m, fb), CUDA_ERROR_INVALID_IMAGE);
}

static void test_libraries(void)
{
    static unsigned char fb[4096] __attribute__((aligned(8)));
    make_fatbin(fb, 1, 0x11, PTX, sizeof PTX);
    CUlibrary lib;
    CUkernel k, ks[4];
    CUfunction f;
    CUmodule m;
    unsigned n = 0;
    const char *name = NULL;
    CHECK_EQ(cuLibraryLoadData(&lib, fb, NULL, NULL, 0, NULL, NULL, 0), CUDA_SUCCESS);
    CHECK_EQ(cuLibraryGetKernelCount(&n, lib), CUDA_SUCCESS);
    CHECK_EQ(n, 2);
    CHECK_EQ(cuLibraryEnumerateKernels(ks, 4, lib), CUDA_SUCCESS);
    CHECK_EQ(cuLibraryGetKernel(&k, lib, "first"), CUDA_SUCCESS);
    CHECK(k == ks[0]);
    CHECK_EQ(cuLibraryGetKernel(&k, lib, "third"), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(cuLibraryGetKernel(&k, lib, "second"), CUDA_SUCCESS);
    CHECK_EQ(cuKernelGetName(&name, k), CUDA_SUCCESS);
    CHECK(name && strcmp(name, "second") == 0);
    CHECK_EQ(cuKernelGetFunction(&f, k), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    /* a CUkernel passed where a CUfunction goes, as the runtime does */
    CHECK_EQ(cuLaunchKernel((CUfunction)(void *)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuLibraryGetModule(&m, lib), CUDA_SUCCESS);
    CUfunction g;
    CHECK_EQ(cuModuleGetFunction(&g, m, "second"), CUDA_SUCCESS);
    CHECK(g == f); /* the library's module in this context is the one its kernels run in */
    CUdeviceptr p;
    size_t bytes;
    CHECK_EQ(cuLibraryGetGlobal(&p, &bytes, lib, "x"), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(cuLibraryUnload(lib), CUDA_SUCCESS);
    CHECK_EQ(cuLaunchKernel((CUfunction)(void *)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cuLibraryUnload(lib), CUDA_ERROR_INVALID_HANDLE);
}

static void test_capture(void)
{
    CUmodule m;
    CUfunction f;
    CUstream s;
    CUgraph g;
    CUgraphExec x;
    CUstreamCaptureStatus st;
    size_t n = 0;
    CHECK_EQ(cuModuleLoadData(&m, PTX), CUDA_SUCCESS);
    CHECK_EQ(cuModuleGetFunction(&f, m, "first"), CUDA_SUCCESS);
    CHECK_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(cuLaunchKernel(f, 4, 1, 1, 32, 1, 1, 0, s, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK_EQ(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
    CHECK_EQ(cuGraphGetNodes(g, NULL, &n), CUDA_SUCCESS);
    CHECK_EQ(n, 3);
    CUgraphNode nodes[3];
    CUgraphNodeType t;
    CHECK_EQ(cuGraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
    CHECK_EQ(cuGraphNodeGetType(nodes[2], &t), CUDA_SUCCESS);
    CHECK_EQ(t, CU_GRAPH_NODE_TYPE_KERNEL);
    CHECK_EQ(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
    CHECK_EQ(cuGraphLaunch(x, s), CUDA_SUCCESS);
    CHECK_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(cuGraphExecDestroy(x), CUDA_SUCCESS);
    CHECK_EQ(cuGraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(cuModuleUnload(m), CUDA_SUCCESS);
}

static const CUuuid CUDART = {{(char)0x6b, (char)0xd5, (char)0xfb, 0x6c, 0x5b, (char)0xf4, (char)0xe7, 0x4a,
                               (char)0x89, (char)0x87, (char)0xd9, 0x39, 0x12, (char)0xfd, (char)0x9d, (char)0xf9}};
static const CUuuid INTEGRITY = {{(char)0xd4, 0x08, 0x20, 0x55, (char)0xbd, (char)0xe6, 0x70, 0x4b,
                                  (char)0x8d, 0x34, (char)0xba, 0x12, 0x3c, 0x66, (char)0xe1, (char)0xf2}};
static const CUuuid SKIP_INIT = {{(char)0xf8, (char)0xcf, (char)0xf9, 0x51, 0x21, 0x46, (char)0x8b, 0x4e,
                                  (char)0xb9, (char)0xe2, (char)0xfb, 0x46, (char)0x9e, 0x7c, 0x0d, (char)0xd9}};

static void test_export_tables(void)
{
    const void *t = NULL;
    CHECK_EQ(cuGetExportTable(&t, &CUDART), CUDA_SUCCESS);
    CHECK(t && ((const uintptr_t *)t)[0] == 13 * sizeof(void *));
    CHECK_EQ(cuGetExportTable(&t, &SKIP_INIT), CUDA_ERROR_NOT_FOUND);
    CUuuid other = CUDART;
    other.bytes[0] = 0;
    CHECK_EQ(cuGetExportTable(&t, &other), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(cuGetExportTable(&t, &INTEGRITY), CUDA_SUCCESS);
    typedef CUresult (*check_fn)(unsigned, uint64_t, uint64_t *);
    check_fn check = (check_fn)((const uintptr_t *)t)[1];
    uint64_t a[2], b[2];
    CHECK_EQ(check(12090, 1700000000, a), CUDA_SUCCESS); /* version ending in 0: fixed */
    CHECK(a[0] == 0x3341181C03CB675Cull && a[1] == 0x8ED383AA1F4CD1E8ull);
    CHECK_EQ(check(12092, 1700000000, a), CUDA_SUCCESS);
    CHECK_EQ(check(12092, 1700000000, b), CUDA_SUCCESS);
    CHECK(memcmp(a, b, sizeof a) == 0); /* the same inputs, the same answer */
    CHECK_EQ(check(12092, 1700000001, b), CUDA_SUCCESS);
    CHECK(memcmp(a, b, sizeof a) != 0); /* the clock is hashed */
}

static void test_md2(void)
{
    static const char *in[] = {"", "abc", "message digest"};
    static const char *want[] = {"8350e5a3e24c153df2275c9f80692773", "da853b0d3f88d99b30283a69e6ded6bb",
                                 "ab4f496bfb2a530b219ff33031fe06b0"};
    for (int i = 0; i < 3; i++) {
        struct md2 m;
        uint8_t d[16];
        char hex[33];
        md2_init(&m);
        md2_update(&m, in[i], strlen(in[i]));
        md2_final(&m, d);
        for (int j = 0; j < 16; j++)
            snprintf(hex + 2 * j, 3, "%02x", d[j]);
        CHECK(strcmp(hex, want[i]) == 0);
    }
}

int main(void)
{
    CUcontext c;
    CUdevice d;
    test_md2();
    CHECK_EQ(cuInit(0), CUDA_SUCCESS);
    CHECK_EQ(cuDeviceGet(&d, 0), CUDA_SUCCESS);
    CHECK_EQ(cuDevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
    CHECK_EQ(cuCtxSetCurrent(c), CUDA_SUCCESS);
    test_fatbins();
    test_libraries();
    test_capture();
    test_export_tables();
    CHECK_EQ(cuDevicePrimaryCtxRelease(d), CUDA_SUCCESS);
    CHECK_DONE();
}
