/* Shared by every benchmark kernel: fixed-width types and one small PRNG.
 *
 * Kernels are plain freestanding C (no libc, no allocation): each exposes `uint64_t kernel_<name>(uint64_t n)`
 * doing work proportional to n on its own static buffers and returning a checksum. The same source is built
 * natively (gcc), for the RV64 guest (clang via ziglang) and for wasm32, and must give the same checksum on all.
 * Use only explicitly sized integer types: `long` and pointers differ in width between those targets.
 */
#ifndef BERM_KERNEL_H
#define BERM_KERNEL_H

#include <stdint.h>

/* xorshift64: deterministic data for every kernel, identical on every target. */
static inline uint64_t kernel_rng(uint64_t *state) {
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

#endif
