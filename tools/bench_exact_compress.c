/* What exact 64-bit registers cost SHA-256's compression, in plain C: no checks, no polls, nothing observed.
 *
 *     gcc -O2 tools/bench_exact_compress.c -o /tmp/compress && /tmp/compress
 *
 * The kernel's own sha_compress (tools/kernels/sha256.c) is the compression as native code runs it: 32-bit values,
 * each rotate one x86 instruction. compress64 is the same compression as the RV64 guest computes it (no Zbb, so no
 * rotate or byte-swap instruction): a rotate is `srliw` + `slli` + `or`, whose upper 32 bits are not zero, the adds
 * are 64-bit, and the message words are stored as 32 bits and loaded sign-extended — the values Berm's translation
 * must hold exactly, since a trap or an exit may observe any register. Both end in the same digest words (printed).
 * The ratio is a floor under what a translated compression can reach. */
#include <stdio.h>
#include <time.h>

#include "kernels/sha256.c" /* sha_compress and sha_k, the kernel's own */

/* srliw t, x, r; slli u, x, 32 - r; or d, u, t */
static inline uint64_t guest_rotr(uint64_t x, unsigned r) { return (x << (32 - r)) | (uint64_t)((uint32_t)x >> r); }

/* srliw d, x, r */
static inline uint64_t guest_shr(uint64_t x, unsigned r) { return (uint32_t)x >> r; }

/* lw: a 32-bit word, sign-extended */
static inline uint64_t guest_lw(uint32_t v) { return (uint64_t)(int64_t)(int32_t)v; }

__attribute__((noinline)) static void compress32(uint32_t h[8], const uint8_t *p) { sha_compress(h, p); }

__attribute__((noinline)) static void compress64(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++) { /* lw, then the byte swap in shifts, masks and ors */
        uint32_t word;
        __builtin_memcpy(&word, p + 4 * i, 4);
        uint64_t x = guest_lw(word);
        uint64_t hi = ((x & 0xff00) << 8) | (x << 24), lo = guest_shr(x, 24) | ((x >> 8) & 0xff00);
        w[i] = (uint32_t)(hi | lo);
    }
    for (int i = 16; i < 64; i++) {
        uint64_t w15 = guest_lw(w[i - 15]), w2 = guest_lw(w[i - 2]);
        uint64_t s0 = guest_rotr(w15, 7) ^ guest_rotr(w15, 18) ^ guest_shr(w15, 3);
        uint64_t s1 = guest_rotr(w2, 17) ^ guest_rotr(w2, 19) ^ guest_shr(w2, 10);
        w[i] = (uint32_t)(guest_lw(w[i - 16]) + s0 + guest_lw(w[i - 7]) + s1);
    }
    uint64_t a = guest_lw(h[0]), b = guest_lw(h[1]), c = guest_lw(h[2]), d = guest_lw(h[3]);
    uint64_t e = guest_lw(h[4]), f = guest_lw(h[5]), g = guest_lw(h[6]), hh = guest_lw(h[7]);
    for (int i = 0; i < 64; i++) {
        uint64_t t1 = hh + (guest_rotr(e, 6) ^ guest_rotr(e, 11) ^ guest_rotr(e, 25)) + (((g ^ f) & e) ^ g) +
                      guest_lw(sha_k[i]) + guest_lw(w[i]);
        uint64_t t2 = (guest_rotr(a, 2) ^ guest_rotr(a, 13) ^ guest_rotr(a, 22)) + (((b ^ c) & a) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    enum { CALLS = 100000, ROUNDS = 15 };
    uint8_t block[64];
    for (int i = 0; i < 64; i++) block[i] = (uint8_t)(i * 0x9d);
    uint32_t h32[8] = {1, 2, 3, 4, 5, 6, 7, 8}, h64[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double best32 = 1e9, best64 = 1e9; /* the fastest round of each: this machine's speed phases only add time */
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = seconds();
        for (int i = 0; i < CALLS; i++) compress32(h32, block);
        double t1 = seconds();
        for (int i = 0; i < CALLS; i++) compress64(h64, block);
        double t2 = seconds();
        best32 = t1 - t0 < best32 ? t1 - t0 : best32;
        best64 = t2 - t1 < best64 ? t2 - t1 : best64;
    }
    printf("one compression, fastest of %d: 32-bit %.1f ns, exact 64-bit %.1f ns: %.2fx (digest words %08x %08x)\n",
           ROUNDS, best32 / CALLS * 1e9, best64 / CALLS * 1e9, best64 / best32, h32[0], h64[0]);
    return __builtin_memcmp(h32, h64, sizeof h32) != 0; /* all eight digest words must agree */
}
