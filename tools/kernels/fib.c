/* Naive doubly recursive Fibonacci: n times fib(14 or 15). One unit of work = one fib(14..15), ~1,000–2,000 calls.
 * The point is call and return cost, so fib must stay a real recursive function. */
#include "kernel.h"

__attribute__((noinline)) static uint64_t fib(uint32_t k) {
    return k < 2 ? k : fib(k - 1) + fib(k - 2);
}

uint64_t kernel_fib(uint64_t n) {
    uint64_t sum = 0;
    for (uint64_t r = 0; r < n; r++)
        sum += fib(14 + (uint32_t)(r & 1)) ^ r;
    return sum;
}
