/* A process that goes around libtessera on purpose, as a tenant could: it finds the driver's
 * own entry points by reading libcuda.so.1's dynamic symbol table (never through dlsym,
 * dlvsym or cuGetProcAddress, which the library answers), then allocates MIB of device
 * memory on GPU 0, prints "raw allocated <MIB>", holds it for SECONDS, frees it and prints
 * "freed".  Only the node daemon's audit (the driver's own per-process figures) sees it.
 * Usage: cuda-raw MIB [SECONDS]. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct lib {
    const char *path;
    ElfW(Addr) base;
};

static int find_cuda(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct lib *l = data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libcuda.so")) {
        l->path = info->dlpi_name;
        l->base = info->dlpi_addr;
        return 1;
    }
    return 0;
}

static unsigned char *image;

/* The address of `name` in libcuda, from its file's .dynsym. */
static void *raw(const struct lib *l, const char *name)
{
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)image;
    const ElfW(Shdr) *sh = (const ElfW(Shdr) *)(image + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM)
            continue;
        const ElfW(Sym) *sym = (const ElfW(Sym) *)(image + sh[i].sh_offset);
        const char *str = (const char *)(image + sh[sh[i].sh_link].sh_offset);
        for (size_t k = 0; k < sh[i].sh_size / sizeof *sym; k++)
            if (sym[k].st_value && !strcmp(str + sym[k].st_name, name))
                return (void *)(l->base + sym[k].st_value);
    }
    fprintf(stderr, "cuda-raw: %s not in %s\n", name, l->path);
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs("usage: cuda-raw MIB [SECONDS]\n", stderr);
        return 2;
    }
    size_t mib = strtoull(argv[1], NULL, 10);
    unsigned seconds = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 0;
    if (!dlopen("libcuda.so.1", RTLD_NOW)) {
        fprintf(stderr, "cuda-raw: %s\n", dlerror());
        return 1;
    }
    struct lib l = {NULL, 0};
    dl_iterate_phdr(find_cuda, &l);
    FILE *f = l.path ? fopen(l.path, "rb") : NULL;
    if (!f) {
        fputs("cuda-raw: libcuda.so.1 not found\n", stderr);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    image = malloc((size_t)size);
    if (!image || fread(image, 1, (size_t)size, f) != (size_t)size) {
        fputs("cuda-raw: cannot read libcuda.so.1\n", stderr);
        return 1;
    }
    fclose(f);
    CUresult (*init)(unsigned) = raw(&l, "cuInit");
    CUresult (*get)(CUdevice *, int) = raw(&l, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = raw(&l, "cuDevicePrimaryCtxRetain");
    CUresult (*current)(CUcontext) = raw(&l, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = raw(&l, "cuMemAlloc_v2");
    CUresult (*release)(CUdeviceptr) = raw(&l, "cuMemFree_v2");
    CUdevice device;
    CUcontext context;
    CUdeviceptr pointer;
    CUresult r;
    if ((r = init(0)) || (r = get(&device, 0)) || (r = retain(&context, device)) ||
        (r = current(context)) || (r = alloc(&pointer, mib << 20))) {
        fprintf(stderr, "cuda-raw: the driver said %d\n", (int)r);
        return 1;
    }
    printf("raw allocated %zu\n", mib);
    fflush(stdout);
    sleep(seconds);
    if (release(pointer))
        return 1;
    puts("freed");
    return 0;
}
