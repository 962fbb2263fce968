/* A native stack of the runtime's own, and calls that run on it (native_stack.c).
 *
 * Translated code runs on its region's stack, not on the host thread's (core.c, berm_run): how deep a guest may
 * recurse then does not depend on the thread that happens to call it, and its recursion cannot use up the stack
 * that the Python code it calls back needs. A call served in Python switches back to the host thread's stack, to
 * just below the frame that entered the guest (core.c, py_ecall), so it has all the room the caller had. */
#ifndef BERM_NATIVE_STACK_H
#define BERM_NATIVE_STACK_H

#include <stddef.h>
#include <stdint.h>

typedef struct berm_native_stack {
    void *map;       /* the whole mapping: an inaccessible guard at its bottom, then the stack */
    size_t map_len;
    uintptr_t lo;    /* the lowest usable address (just above the guard) */
    uintptr_t top;   /* one past the highest: where a call on this stack starts (16-byte aligned) */
} berm_native_stack;

/* Map `size` bytes of stack (rounded up to host pages) above a guard page; pages cost memory once touched.
 * Returns 0 (and leaves *s empty) when the mapping fails. */
int berm_native_stack_new(berm_native_stack *s, size_t size);
void berm_native_stack_free(berm_native_stack *s);
/* Hand the pages of the stack below its top `keep` bytes back to the kernel (a deep recursion left them resident);
 * they read as zero when touched again. */
void berm_native_stack_release(const berm_native_stack *s, size_t keep);

/* fn(arg) with the stack pointer at `top` (16-byte aligned, the highest address + 1 of free stack), returning its
 * result; *caller_sp receives the stack pointer of the stack this was called on (everything below it is free
 * until this returns). */
uint64_t berm_switch_call(uintptr_t top, uint64_t (*fn)(void *), void *arg, uintptr_t *caller_sp);

/* Where a call switching back to the stack whose pointer berm_switch_call saved may start: below that pointer,
 * with room to spare, aligned. */
static inline uintptr_t berm_resume_top(uintptr_t caller_sp) { return (caller_sp - 256) & ~(uintptr_t)15; }

#endif
