/* The fat binary container nvcc embeds in a program (and cuModuleLoadData takes): a
 * 16-byte header (magic 0xBA55ED50, version, header size, size of what follows) and then
 * entries, each a header (kind: 1 PTX, 2 ELF; its own size; payload size; for PTX its
 * address size and ISA version; target SM; flags, compression among them) followed by its
 * payload.  nvcc's wrapper (magic
 * 0x466243B1), which the runtime may hand over instead, is followed to its fatbin.  Pure;
 * see sim/README.md. */
#ifndef TESSERA_SIM_FATBIN_H
#define TESSERA_SIM_FATBIN_H

#include <stddef.h>
#include <stdint.h>

#define FATBIN_MAGIC 0xBA55ED50u
#define FATBINC_MAGIC 0x466243B1u /* nvcc's wrapper around it: magic, version, the fatbin */

enum fatbin_result {
    FATBIN_PTX,         /* *ptx, *len: the PTX text of the newest uncompressed PTX entry */
    FATBIN_NOT_FATBIN,  /* no fatbin header */
    FATBIN_MALFORMED,   /* sizes that do not add up */
    FATBIN_NO_PTX,      /* machine code only (none runs here) */
    FATBIN_COMPRESSED,  /* PTX only in compressed entries */
    FATBIN_BAD_PTX_HEADER, /* PTX only in entries with no ISA version or address size */
};

/* `limit`: bytes readable at `image` (SIZE_MAX when the caller does not know: the header's
 * own sizes are trusted, as the driver trusts them). */
enum fatbin_result fatbin_ptx(const void *image, size_t limit, const char **ptx, size_t *len);

#endif
