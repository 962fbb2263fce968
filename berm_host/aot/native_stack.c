/* A native stack of the runtime's own, and calls that run on it: see native_stack.h for why. */
#include "native_stack.h"

#include <sys/mman.h>
#include <unistd.h>

int berm_native_stack_new(berm_native_stack *s, size_t size) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size = (size + page - 1) / page * page;
    *s = (berm_native_stack){0};
    void *map = mmap(NULL, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                     -1, 0);
    if (map == MAP_FAILED) return 0;
    if (mprotect(map, page, PROT_NONE) != 0) { /* a stack without its guard is not one to run on */
        munmap(map, size + page);
        return 0;
    }
    s->map = map;
    s->map_len = size + page;
    s->lo = (uintptr_t)map + page;
    s->top = ((uintptr_t)map + size + page) & ~(uintptr_t)15;
    return 1;
}

void berm_native_stack_free(berm_native_stack *s) {
    if (s->map) munmap(s->map, s->map_len);
    *s = (berm_native_stack){0};
}

void berm_native_stack_release(const berm_native_stack *s, size_t keep) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t end = (s->top - keep) & ~(uintptr_t)(page - 1);
    if (end > s->lo) madvise((void *)s->lo, end - s->lo, MADV_DONTNEED); /* advice: a failure only costs memory */
}

/* berm_switch_call(top, fn, arg, caller_sp): the frame pointer register keeps the caller's stack pointer across the
 * call (fn preserves it, as every function must), and the CFI names it as the frame's base, so debuggers and
 * profilers unwind from guest code back into the host's frames. */
#if defined(__x86_64__)
__asm__(".text\n"
        ".p2align 4\n"
        ".globl berm_switch_call\n"
        ".hidden berm_switch_call\n"
        ".type berm_switch_call, @function\n"
        "berm_switch_call:\n"         /* rdi = top, rsi = fn, rdx = arg, rcx = caller_sp */
        "  .cfi_startproc\n"
        "  pushq %rbp\n"
        "  .cfi_def_cfa_offset 16\n"
        "  .cfi_offset %rbp, -16\n"
        "  movq %rsp, %rbp\n"
        "  .cfi_def_cfa_register %rbp\n"
        "  movq %rsp, (%rcx)\n"
        "  movq %rdi, %rsp\n"
        "  movq %rdx, %rdi\n"
        "  callq *%rsi\n"
        "  movq %rbp, %rsp\n"
        "  popq %rbp\n"
        "  .cfi_def_cfa %rsp, 8\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size berm_switch_call, . - berm_switch_call\n");
#elif defined(__aarch64__)
__asm__(".text\n"
        ".p2align 2\n"
        ".globl berm_switch_call\n"
        ".hidden berm_switch_call\n"
        ".type berm_switch_call, %function\n"
        "berm_switch_call:\n"         /* x0 = top, x1 = fn, x2 = arg, x3 = caller_sp */
        "  .cfi_startproc\n"
        "  stp x29, x30, [sp, #-16]!\n"
        "  .cfi_def_cfa_offset 16\n"
        "  .cfi_offset x29, -16\n"
        "  .cfi_offset x30, -8\n"
        "  mov x29, sp\n"
        "  .cfi_def_cfa x29, 16\n"
        "  str x29, [x3]\n"
        "  mov sp, x0\n"
        "  mov x0, x2\n"
        "  blr x1\n"
        "  mov sp, x29\n"
        "  .cfi_def_cfa sp, 16\n"
        "  ldp x29, x30, [sp], #16\n"
        "  .cfi_def_cfa_offset 0\n"
        "  .cfi_restore x29\n"
        "  .cfi_restore x30\n"
        "  ret\n"
        "  .cfi_endproc\n"
        ".size berm_switch_call, . - berm_switch_call\n");
#else
#error "berm: no stack switch for this architecture (native_stack.c has x86-64 and AArch64)"
#endif
