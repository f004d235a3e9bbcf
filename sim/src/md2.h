/* MD2 (RFC 1319) and HMAC over it (RFC 2104, 16-byte blocks): what the CUDA runtime's
 * integrity check asks the driver to compute (cuda_export.c).  Pure; no state but the
 * caller's. */
#ifndef TESSERA_SIM_MD2_H
#define TESSERA_SIM_MD2_H

#include <stddef.h>
#include <stdint.h>

struct md2 {
    uint8_t x[48];        /* state, the block being filled, their XOR */
    uint8_t checksum[16];
    uint8_t count;        /* bytes of the block filled */
    uint8_t last;         /* the checksum's running byte */
};

void md2_init(struct md2 *m);
void md2_update(struct md2 *m, const void *data, size_t n);
void md2_final(struct md2 *m, uint8_t digest[16]);

/* HMAC-MD2 with a 16-byte key over the concatenation of `nparts` parts. */
void hmac_md2(const uint8_t key[16], const void *const *parts, const size_t *sizes,
              size_t nparts, uint8_t digest[16]);

#endif
