/* The runtime interface between translated guest code (berm_aot.emit) and the runtime core (core.c).
 *
 * A translated image is a shared object that includes this header (through berm_code.h) and nothing else: it
 * reaches the core only through the function pointers in berm_ctx, so it has no link-time dependency. Change
 * anything here and bump BERM_RT_ABI (it is part of every cache key).
 *
 * Conventions of the translated code (see berm_aot/emit):
 *   - one C function per guest function, `uint64_t f(berm_ctx *ctx, uint64_t ret, uint32_t depth)`, returning
 *     the next pc (`depth`: frames on the shadow call stack, its own included; a call passes depth + 1):
 *     `ret` for a normal return, BERM_TAIL with ctx->next = the target for a tail call, BERM_TRAPPED on a trap.
 *     Real pcs are even, so the odd sentinels never collide with one.
 *   - guest registers live in C locals; ctx->regs is the register file at function boundaries and after a trap.
 *   - a function's direct calls to itself run in the same C frame: ctx->shadow[depth] keeps the expected return
 *     address of each frame they interrupt.
 *   - memory: guest address a is ctx->mem + a; every access is bounds-checked against two windows (exact, one
 *     compare each, against constants of the layout the unit was translated for: berm_code.h), every store marks
 *     its page dirty so the core can restore only what changed (a store into the stack marks only the fine map;
 *     the core folds the stack's marks in after each run; a group of stores into the stack lowers
 *     ctx->stack_low instead, and the core restores the stack from there up).
 */
#ifndef BERM_RT_H
#define BERM_RT_H

#include <stdint.h>
#include <string.h>

#define BERM_RT_ABI 12

/* Guest memory is little-endian and is read and written with memcpy of host integers. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "Berm's translated code needs a little-endian host");

#define BERM_TRAPPED 1u
#define BERM_TAIL 3u

#define BERM_PAGE_SHIFT 12
#define BERM_COARSE_SHIFT 18 /* one coarse dirty byte per 64 pages */
#define BERM_PAGES_PER_COARSE ((uint64_t)1 << (BERM_COARSE_SHIFT - BERM_PAGE_SHIFT))

/* The dirty maps of a region of guest memory of `size` bytes live just below it, in the same mapping, so that
 * translated code reaches them at constant offsets from ctx->mem and no register holds them:
 * [fine map][coarse map][padding to 64 KiB, its last 8 bytes the interrupt flag][guest memory], so guest memory
 * stays aligned to host pages of up to 64 KiB (madvise needs that). The fine map has one byte per page, padded to
 * whole coarse blocks (a multiple of 8 bytes); the coarse map one byte per 64 pages, plus one, padded to 8 bytes.
 * The interrupt flag sits there, not in berm_ctx, so that a back-edge polls it through the register every memory
 * access uses (berm_code.h, BERM_POLL): a loop that touches nothing else of ctx needs no register for it. */
#define BERM_FINE_BYTES(size) \
    (((uint64_t)(size) >> BERM_PAGE_SHIFT) + BERM_PAGES_PER_COARSE - 1) / BERM_PAGES_PER_COARSE * BERM_PAGES_PER_COARSE
#define BERM_COARSE_BYTES(size) ((((uint64_t)(size) >> BERM_COARSE_SHIFT) + 1 + 7) & ~(uint64_t)7)
#define BERM_INTERRUPT_BYTES 8
#define BERM_INTERRUPT_AT(mem) ((volatile int32_t *)((mem) - BERM_INTERRUPT_BYTES))
#define BERM_MAPS_BYTES(size) \
    ((BERM_FINE_BYTES(size) + BERM_COARSE_BYTES(size) + BERM_INTERRUPT_BYTES + 65535) & ~(uint64_t)65535)
#define BERM_MAX_CALL_DEPTH 10000u
/* How many frames of a trap's call chain ctx->trace keeps (the innermost; berm_host/layout.py, TRACE_KEEP). */
#define BERM_TRACE_KEEP 32u

enum berm_trap_kind {
    BERM_TRAP_NONE = 0,
    BERM_TRAP_MEMORY = 1,
    BERM_TRAP_BAD_TARGET = 2,
    BERM_TRAP_BREAKPOINT = 3,
    BERM_TRAP_UNKNOWN_CALL = 4,
    BERM_TRAP_CALL_FAILED = 5,
    BERM_TRAP_ILLEGAL = 6,
    BERM_TRAP_INTERRUPTED = 7,
    BERM_TRAP_STACK = 8,
};

/* trap_detail for memory faults: (access << 8) | size in bytes. */
enum berm_access { BERM_LOAD = 0, BERM_STORE = 1, BERM_MISALIGNED = 2 };
/* trap_detail for stack traps. */
enum berm_stack_why { BERM_STACK_DEPTH = 0, BERM_STACK_NATIVE = 1, BERM_STACK_HOST = 2, BERM_STACK_POINTER = 3 };

typedef struct berm_ctx berm_ctx;

struct berm_ctx {
    /* --- read by translated code on every function entry --- */
    uint8_t *mem;     /* guest address a lives at mem + a */
    uint8_t *dirty;   /* one byte per 4 KiB page: mem - BERM_MAPS_BYTES(size) */
    uint8_t *coarse;  /* one byte per 256 KiB: dirty + BERM_FINE_BYTES(size) */
    /* Two limits the watchdog drops along with raising the interrupt flag, so that one compare both checks and
     * polls (berm_code.h, BERM_ENTRY and BERM_SELF_CALL): native_limit is native_floor, the lowest address
     * translated code may reach on its region's native stack (core.h, BERM_NATIVE_STACK), and UINTPTR_MAX once
     * interrupted; depth_limit is BERM_MAX_CALL_DEPTH, and 0 once interrupted. The slow path then tells the two
     * apart, from the flag and native_floor. */
    volatile uintptr_t native_limit;
    volatile uint32_t depth_limit;
    uintptr_t native_floor;
    uint64_t next;  /* tail call target when a function returns BERM_TAIL */
    /* Bumped by every dynamic transfer (indirect call, indirect jump to a function entry): a caller that sees it
     * change across a call reloads all of its registers, since the static write summaries did not cover it. */
    uint64_t wild;
    /* The lowest address a group of stores into the stack (BERM_GROUP_MARK) wrote since the last reset, or
     * the end of memory: the core restores the stack from there to the top, byte-exactly (core.c, reset_memory). */
    uint64_t stack_low;
    /* The watchdog's interrupt flag: BERM_INTERRUPT_AT(mem), below guest memory (translated code polls it there). */
    volatile int32_t *interrupt;

    /* --- the trap, when trap_kind != 0 --- */
    int32_t trap_kind;
    uint32_t trap_detail;
    uint64_t trap_pc;
    uint64_t trap_addr;

    uint64_t regs[32];

    /* --- served inline --- */
    uint64_t args_len;
    uint64_t heap_start;
    uint64_t heap_size;

    /* --- the core's entry points --- */
    /* Any ecall the translated code does not serve inline; sets trap_kind on a trap. */
    uint64_t (*ecall)(berm_ctx *ctx, uint64_t pc, uint64_t number, uint64_t a0, uint64_t a1, uint64_t a2,
                      uint64_t a3, uint64_t a4, uint64_t a5);
    /* The same, for a call the translator knows takes two arguments (berm_aot/emit/function.py, _TWO_ARG_CALLS):
     * every argument in a register, and the copies (berm.args.read, berm.result.read) served first. */
    uint64_t (*ecall2)(berm_ctx *ctx, uint64_t pc, uint64_t number, uint64_t a0, uint64_t a1);

    /* BERM_MAX_CALL_DEPTH + 1 slots: a function that calls itself runs the new frame in the same C frame and
     * keeps the expected return address of the frame it interrupts at shadow[depth] (berm_aot/emit/function.py). */
    uint64_t *shadow;

    /* --- the call chain a trap unwound, recorded by each C frame's trap block (berm_code.h, berm_trace) --- */
    uint32_t trace_frames;            /* the frames it held (the trapping one included): the depth at the trap */
    uint64_t trace[BERM_TRACE_KEEP];  /* the first frames' expected return addresses, innermost first */
};

typedef uint64_t (*berm_fn)(berm_ctx *ctx, uint64_t ret, uint32_t depth);
/* The one export of a translated image: run the guest function at `entry` (returns 0 or BERM_TRAPPED). */
typedef uint64_t (*berm_enter_fn)(berm_ctx *ctx, uint64_t entry);

#define BERM_HIDDEN __attribute__((visibility("hidden")))
#define BERM_EXPORT __attribute__((visibility("default")))
#define BERM_LIKELY(x) __builtin_expect(!!(x), 1)
#define BERM_UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline __attribute__((always_inline)) void berm_set_trap(berm_ctx *ctx, int kind, uint64_t pc,
                                                                 uint64_t addr, uint32_t detail) {
    ctx->trap_kind = kind;
    ctx->trap_pc = pc;
    ctx->trap_addr = addr;
    ctx->trap_detail = detail;
}

#endif
