/* The fat binary container: see fatbin.h. */
#include "fatbin.h"

#include <string.h>

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t size; /* of the entries that follow the header */
};

/* An entry's header as nvcc 13 writes it (80 bytes; 64 in older toolkits, the fields below
 * the same): read from a real driver's own fat binaries (sim/README.md). */
struct fatbin_entry {
    uint16_t kind;
    uint16_t version;
    uint32_t header_size;
    uint64_t payload_size; /* padded to 8 */
    uint32_t compressed_size;
    uint32_t address_bits; /* PTX: its .address_size (32, 64) */
    uint16_t isa_minor, isa_major; /* PTX: its .version */
    uint32_t sm;
    uint32_t name_offset, name_len;
    uint64_t flags;
    uint64_t reserved;
    uint64_t uncompressed_size;
};

_Static_assert(sizeof(struct fatbin_header) == 16, "the container's layout");
_Static_assert(sizeof(struct fatbin_entry) == 64, "the container's layout");

struct fatbinc_wrapper {
    uint32_t magic;
    uint32_t version;
    const void *data;
    const void *filename_or_fatbins;
};

#define KIND_PTX 1
#define FLAG_COMPRESSED (0x2000u | 0x8000u) /* LZ4, Zstandard */

enum fatbin_result fatbin_ptx(const void *image, size_t limit, const char **ptx, size_t *len)
{
    struct fatbin_header h;
    if (!image || limit < sizeof h)
        return FATBIN_NOT_FATBIN;
    memcpy(&h, image, sizeof h);
    if (h.magic == FATBINC_MAGIC) { /* nvcc's wrapper: its data is the fatbin */
        struct fatbinc_wrapper w;
        memcpy(&w, image, sizeof w);
        return w.data ? fatbin_ptx(w.data, SIZE_MAX, ptx, len) : FATBIN_MALFORMED;
    }
    if (h.magic != FATBIN_MAGIC)
        return FATBIN_NOT_FATBIN;
    if (h.header_size < sizeof h || h.size > limit - h.header_size)
        return FATBIN_MALFORMED;
    const unsigned char *p = (const unsigned char *)image + h.header_size;
    const unsigned char *end = p + h.size;
    const unsigned char *best = NULL;
    size_t best_len = 0;
    uint32_t best_sm = 0;
    int compressed = 0, bad_header = 0;
    while ((size_t)(end - p) >= sizeof(struct fatbin_entry)) {
        struct fatbin_entry e;
        memcpy(&e, p, sizeof e);
        if (e.header_size < sizeof e || e.header_size > (size_t)(end - p) ||
            e.payload_size > (size_t)(end - p) - e.header_size)
            return FATBIN_MALFORMED;
        const unsigned char *payload = p + e.header_size;
        if (e.kind == KIND_PTX) {
            if (e.flags & FLAG_COMPRESSED) {
                compressed = 1;
            } else if (e.isa_major == 0 || (e.address_bits != 32 && e.address_bits != 64)) {
                bad_header = 1; /* the real driver's JIT refuses it (CUDA_ERROR_INVALID_PTX) */
            } else if (!best || e.sm > best_sm) {
                best = payload;
                best_len = strnlen((const char *)payload, e.payload_size);
                best_sm = e.sm;
            }
        }
        p = payload + e.payload_size;
    }
    if (best) {
        *ptx = (const char *)best;
        *len = best_len;
        return FATBIN_PTX;
    }
    return bad_header ? FATBIN_BAD_PTX_HEADER : compressed ? FATBIN_COMPRESSED : FATBIN_NO_PTX;
}
