/* The kernels as a static RV64 Linux program, for the qemu-user peer of tools/bench.py: the same kernel code as the
 * Berm guest (same compiler, flags and link), with this entry instead of start.c's. No libc: two system calls.
 *
 *     qemu-riscv64 kernels.elf KERNEL N    prints kernel_KERNEL(N) as 16 hex digits and a newline; exit status 2
 *                                          for a bad command line
 * KERNEL is the kernel's index in tools/bench_build.py's KERNELS (0 = sha256, ... 4 = tokenize). */
#include "kernel.h"

uint64_t kernel_sha256(uint64_t n);
uint64_t kernel_crc32(uint64_t n);
uint64_t kernel_sort(uint64_t n);
uint64_t kernel_fib(uint64_t n);
uint64_t kernel_tokenize(uint64_t n);

static uint64_t (*const kernels[])(uint64_t) = {kernel_sha256, kernel_crc32, kernel_sort, kernel_fib,
                                                kernel_tokenize};

static long linux_call(long number, long a0, long a1, long a2) {
    register long r0 __asm__("a0") = a0;
    register long r1 __asm__("a1") = a1;
    register long r2 __asm__("a2") = a2;
    register long r7 __asm__("a7") = number;
    __asm__ volatile("ecall" : "+r"(r0) : "r"(r1), "r"(r2), "r"(r7) : "memory");
    return r0;
}

#define LINUX_WRITE 64
#define LINUX_EXIT 93

static __attribute__((noreturn)) void quit(long status) {
    for (;;) linux_call(LINUX_EXIT, status, 0, 0);
}

/* A decimal number, or -1 when s is not one. */
static int64_t decimal(const char *s) {
    int64_t v = 0;
    if (!*s) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* Called by _start with the initial stack: argc, then argv. */
__attribute__((used, noreturn)) void linux_main(const long *stack) {
    long argc = stack[0];
    const char *const *argv = (const char *const *)(stack + 1);
    if (argc != 3) quit(2);
    int64_t which = decimal(argv[1]), n = decimal(argv[2]);
    if (which < 0 || which >= (int64_t)(sizeof kernels / sizeof kernels[0]) || n < 0) quit(2);
    uint64_t sum = kernels[which]((uint64_t)n);
    char line[17];
    for (int k = 0; k < 16; k++) line[k] = "0123456789abcdef"[(sum >> (60 - 4 * k)) & 15];
    line[16] = '\n';
    linux_call(LINUX_WRITE, 1, (long)line, sizeof line);
    quit(0);
}

__asm__(".globl _start\n"
        "_start:\n"
        "  mv a0, sp\n"
        "  call linux_main\n");
