/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), table-driven, over a 1 KiB PRNG buffer n times, the CRC
 * carried from one pass to the next. One unit of work = one pass over 1 KiB. */
#include "kernel.h"

#define CRC_BUF 1024

static uint32_t crc_table[256];
static uint8_t crc_buf[CRC_BUF];

static void crc_make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[i] = c;
    }
}

static uint32_t crc_update(uint32_t crc, const uint8_t *p, uint32_t len) {
    crc = ~crc;
    for (uint32_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint64_t kernel_crc32(uint64_t n) {
    uint64_t seed = 0xc0ffee1234ULL;
    crc_make_table();
    for (int i = 0; i < CRC_BUF; i++)
        crc_buf[i] = (uint8_t)kernel_rng(&seed);
    uint32_t crc = 0;
    for (uint64_t r = 0; r < n; r++)
        crc = crc_update(crc, crc_buf, CRC_BUF);
    return crc;
}
