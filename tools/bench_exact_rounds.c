/* What exact 64-bit registers cost SHA-256's rounds, in plain C: no checks, no polls, nothing observed.
 *
 *     gcc -O2 tools/bench_exact_rounds.c -o /tmp/rounds && /tmp/rounds
 *
 * rounds32 is the round loop of the kernel's compression (tools/kernels/sha256.c) as native code runs it: 32-bit
 * values, each rotate one x86 instruction. rounds64 is the same loop as the RV64 guest computes it (no Zbb, so no
 * rotate instruction): a rotate is `srliw` + `slli` + `or`, whose upper 32 bits are not zero, and the adds are 64-bit —
 * the values Berm's translation must hold exactly, since a trap or an exit may observe any register. Both end in
 * the same digest words (printed). The ratio is a floor under what translated rounds can reach. */
#include <stdio.h>
#include <time.h>

#include "kernels/sha256.c" /* sha_k and rotr, the kernel's own */

/* srliw t, x, r; slli u, x, 32 - r; or d, u, t */
static inline uint64_t guest_rotr(uint64_t x, unsigned r) { return (x << (32 - r)) | (uint64_t)((uint32_t)x >> r); }

static inline uint64_t sext32(uint32_t v) { return (uint64_t)(int64_t)(int32_t)v; }

__attribute__((noinline)) static void rounds32(uint32_t h[8], const uint32_t *w) {
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        hh = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
}

__attribute__((noinline)) static void rounds64(uint32_t h[8], const uint32_t *w) {
    uint64_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i++) {
        uint64_t t1 = hh + (guest_rotr(e, 6) ^ guest_rotr(e, 11) ^ guest_rotr(e, 25)) + (((g ^ f) & e) ^ g) +
                      sext32(sha_k[i]) + sext32(w[i]);
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
    uint32_t w[64];
    for (int i = 0; i < 64; i++) w[i] = (uint32_t)i * 0x9e3779b9u;
    uint32_t h32[8] = {1, 2, 3, 4, 5, 6, 7, 8}, h64[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    double best32 = 1e9, best64 = 1e9; /* the fastest round of each: this machine's speed phases only add time */
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = seconds();
        for (int i = 0; i < CALLS; i++) rounds32(h32, w);
        double t1 = seconds();
        for (int i = 0; i < CALLS; i++) rounds64(h64, w);
        double t2 = seconds();
        best32 = t1 - t0 < best32 ? t1 - t0 : best32;
        best64 = t2 - t1 < best64 ? t2 - t1 : best64;
    }
    printf("64 rounds, fastest of %d: 32-bit %.1f ns, exact 64-bit %.1f ns: %.2fx (digest words %08x %08x)\n", ROUNDS,
           best32 / CALLS * 1e9, best64 / CALLS * 1e9, best64 / best32, h32[0], h64[0]);
    return h32[0] != h64[0];
}
