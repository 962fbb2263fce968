/* The guest image's entry: never run by the host (ABI.md §3). It takes the address of every kernel, so each one
 * survives --gc-sections and is named by a PCREL_HI20 relocation, as a real harness's tools are. */
#include "kernel.h"

uint64_t kernel_sha256(uint64_t n);
uint64_t kernel_crc32(uint64_t n);
uint64_t kernel_sort(uint64_t n);
uint64_t kernel_fib(uint64_t n);
uint64_t kernel_tokenize(uint64_t n);

typedef uint64_t (*kernel_fn)(uint64_t);

void _start(void) {
    static volatile kernel_fn sink[5];
    sink[0] = kernel_sha256;
    sink[1] = kernel_crc32;
    sink[2] = kernel_sort;
    sink[3] = kernel_fib;
    sink[4] = kernel_tokenize;
}
