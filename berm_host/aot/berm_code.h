/* What translated code (berm_aot.emit) is written in: the macros and helpers every emitted unit uses, on top of
 * the runtime interface (berm_rt.h). Not for the core.
 *
 * A unit defines the guest memory layout it was translated for before including this header: the bounds windows
 * as constants, so every check compares against immediates and no register holds a bound (5-13% on
 * tools/kernels). An n-byte access at a is in bounds iff (a - LO) <= SPAN + 8 - n for one of the two windows it
 * may use (loads: load + stack, stores: store + stack); SPAN = window size - 8, and an empty window repeats the
 * stack's (the host refuses layouts with a window of 1..7 bytes). The object exports the same six numbers
 * (berm_layout) and the core refuses to run it on memory of another layout.
 */
#ifndef BERM_CODE_H
#define BERM_CODE_H

#include "berm_rt.h"

#if !defined(BERM_LOAD_LO) || !defined(BERM_LOAD_SPAN) || !defined(BERM_STORE_LO) || !defined(BERM_STORE_SPAN) || \
    !defined(BERM_STACK_LO) || !defined(BERM_STACK_SPAN)
#error "a translated unit defines its memory layout (BERM_LOAD_LO ... BERM_STACK_SPAN) before including berm_code.h"
#endif

/* ---- arithmetic with RISC-V semantics ---- */
static inline uint64_t berm_mulh(uint64_t a, uint64_t b) {
    return (uint64_t)(((__int128)(int64_t)a * (__int128)(int64_t)b) >> 64);
}
static inline uint64_t berm_mulhsu(uint64_t a, uint64_t b) {
    return (uint64_t)(((__int128)(int64_t)a * (__int128)(unsigned __int128)b) >> 64);
}
static inline uint64_t berm_mulhu(uint64_t a, uint64_t b) {
    return (uint64_t)(((unsigned __int128)a * (unsigned __int128)b) >> 64);
}
static inline uint64_t berm_div(uint64_t a, uint64_t b) {
    if (b == 0) return ~0ull;
    if ((int64_t)a == INT64_MIN && (int64_t)b == -1) return a;
    return (uint64_t)((int64_t)a / (int64_t)b);
}
static inline uint64_t berm_divu(uint64_t a, uint64_t b) { return b ? a / b : ~0ull; }
static inline uint64_t berm_rem(uint64_t a, uint64_t b) {
    if (b == 0) return a;
    if ((int64_t)a == INT64_MIN && (int64_t)b == -1) return 0;
    return (uint64_t)((int64_t)a % (int64_t)b);
}
static inline uint64_t berm_remu(uint64_t a, uint64_t b) { return b ? a % b : a; }
static inline uint64_t berm_sx32(uint64_t v) { return (uint64_t)(int64_t)(int32_t)(uint32_t)v; }
static inline uint64_t berm_divw(uint64_t a, uint64_t b) {
    int32_t x = (int32_t)a, y = (int32_t)b;
    if (y == 0) return ~0ull;
    if (x == INT32_MIN && y == -1) return berm_sx32((uint32_t)x);
    return berm_sx32((uint32_t)(x / y));
}
static inline uint64_t berm_divuw(uint64_t a, uint64_t b) {
    uint32_t x = (uint32_t)a, y = (uint32_t)b;
    return y ? berm_sx32(x / y) : ~0ull;
}
static inline uint64_t berm_remw(uint64_t a, uint64_t b) {
    int32_t x = (int32_t)a, y = (int32_t)b;
    if (y == 0) return berm_sx32((uint32_t)x);
    if (x == INT32_MIN && y == -1) return 0;
    return berm_sx32((uint32_t)(x % y));
}
static inline uint64_t berm_remuw(uint64_t a, uint64_t b) {
    uint32_t x = (uint32_t)a, y = (uint32_t)b;
    return berm_sx32(y ? x % y : x);
}

/* ---- the locals every translated function sets up (copies, so guest stores cannot alias them) ---- */
#define BERM_MEM_SIZE (BERM_STACK_LO + BERM_STACK_SPAN + 8) /* the stack window ends memory */
#define BERM_LOCALS                                                                        \
    uint8_t *const M = ctx->mem;                                                           \
    const uint64_t LLO = BERM_LOAD_LO, LSPAN = BERM_LOAD_SPAN;                             \
    const uint64_t SLO = BERM_STORE_LO, SSPAN = BERM_STORE_SPAN;                           \
    const uint64_t KLO = BERM_STACK_LO, KSPAN = BERM_STACK_SPAN;                           \
    (void)M; (void)LLO; (void)LSPAN; (void)SLO; (void)SSPAN; (void)KLO; (void)KSPAN

/* Each window in one compare; a load or store of n bytes at a is inside when all n bytes are. */
#define BERM_IN_LOAD(a, n) ((uint64_t)((a) - LLO) <= LSPAN + (8 - (n)))
#define BERM_IN_STORE(a, n) ((uint64_t)((a) - SLO) <= SSPAN + (8 - (n)))
#define BERM_IN_STACK(a, n) ((uint64_t)((a) - KLO) <= KSPAN + (8 - (n)))
#define BERM_LOAD_OK(a, n) (BERM_IN_LOAD(a, n) || BERM_IN_STACK(a, n))
#define BERM_STORE_OK(a, n) (BERM_IN_STORE(a, n) || BERM_IN_STACK(a, n))

/* The dirty maps' bytes for address a, addressed from M (berm_rt.h, BERM_MAPS_BYTES): a constant displacement in
 * the store's own address arithmetic. A pointer local for each map instead costs two registers (spilled in
 * sort's partition loop, one reload per mark: 3% of its instructions). */
#define BERM_FINE_AT(a) M[(int64_t)((a) >> BERM_PAGE_SHIFT) - (int64_t)BERM_MAPS_BYTES(BERM_MEM_SIZE)]
#define BERM_COARSE_AT(a) \
    M[(int64_t)((a) >> BERM_COARSE_SHIFT) - (int64_t)(BERM_MAPS_BYTES(BERM_MEM_SIZE) - BERM_FINE_BYTES(BERM_MEM_SIZE))]

/* A store of at most 8 bytes starting in page p can reach only the first 7 bytes of page p+1; the core restores
 * those along with page p, so one mark per store is enough. */
#define BERM_MARK(a)                \
    do {                            \
        BERM_FINE_AT(a) = 1;        \
        BERM_COARSE_AT(a) = 1;      \
    } while (0)
/* A store into the stack window marks only the fine map: the core folds the stack's fine marks (at most 256
 * pages) into the coarse map after every run (core.c, fold_stack_marks). */
#define BERM_MARK_STACK(a) (BERM_FINE_AT(a) = 1)

/* A memory fault: every site shares the function's one `fault` block (small code, fast compiles). */
#define BERM_FAULT(a, access, n, pc)             \
    do {                                         \
        fa_ = (a);                               \
        fd_ = ((uint32_t)(access) << 8) | (n);   \
        jpc_ = (pc);                             \
        goto fault;                              \
    } while (0)

/* One load, dst = *(T *)(M + a) sign- or zero-extended by T: in window IN1, else in IN2, else a fault. BERM_LD tests
 * the load window first, BERM_SP_LD (sp-based loads) the stack's. The second test is nested, not an `||`: gcc
 * computes both halves of an `||` before its one branch (sort: 6% more instructions). */
#define BERM_LD_(IN1, IN2, dst, T, addr, pc)                                                        \
    do {                                                                                            \
        uint64_t a_ = (addr);                                                                       \
        if (BERM_UNLIKELY(!IN1(a_, sizeof(T))))                                                     \
            if (BERM_UNLIKELY(!IN2(a_, sizeof(T)))) BERM_FAULT(a_, BERM_LOAD, sizeof(T), pc);       \
        T v_;                                                                                       \
        memcpy(&v_, M + a_, sizeof v_);                                                             \
        dst = (uint64_t)(int64_t)v_;                                                                \
    } while (0)
#define BERM_LD(dst, T, addr, pc) BERM_LD_(BERM_IN_LOAD, BERM_IN_STACK, dst, T, addr, pc)
#define BERM_SP_LD(dst, T, addr, pc) BERM_LD_(BERM_IN_STACK, BERM_IN_LOAD, dst, T, addr, pc)

/* One store: in window IN1 (marked by MARK1), else in IN2 (MARK2), else a fault. BERM_ST tests the store
 * window first, BERM_SP_ST (sp-based stores) the stack's. */
#define BERM_ST_(IN1, MARK1, IN2, MARK2, T, addr, val, pc)                                          \
    do {                                                                                            \
        uint64_t a_ = (addr);                                                                       \
        T v_ = (T)(val);                                                                            \
        if (BERM_LIKELY(IN1(a_, sizeof(T)))) {                                                      \
            memcpy(M + a_, &v_, sizeof v_);                                                         \
            MARK1(a_);                                                                              \
        } else if (BERM_LIKELY(IN2(a_, sizeof(T)))) {                                               \
            memcpy(M + a_, &v_, sizeof v_);                                                         \
            MARK2(a_);                                                                              \
        } else {                                                                                    \
            BERM_FAULT(a_, BERM_STORE, sizeof(T), pc);                                              \
        }                                                                                           \
    } while (0)
#define BERM_ST(T, addr, val, pc) BERM_ST_(BERM_IN_STORE, BERM_MARK, BERM_IN_STACK, BERM_MARK_STACK, T, addr, val, pc)
#define BERM_SP_ST(T, addr, val, pc) BERM_ST_(BERM_IN_STACK, BERM_MARK_STACK, BERM_IN_STORE, BERM_MARK, T, addr, val, pc)

/* A group of loads and stores through one base register in one straight run of code, the base unchanged between
 * them, all inside [base + lo, base + lo + n) (berm_aot/emit/groups.py). BERM_GROUP checks the whole range against
 * the two windows its accesses may use, the likelier first (W1, W2: STACK, LOAD or STORE), and sets the group's flag
 * g to 1 or 2 for the window that holds all of it, else 0. The stores then account for themselves at once
 * (BERM_GROUP_MARK; `stack` is the flag value of the stack window): in the stack they lower ctx->stack_low to the
 * lowest byte they write (on a recursion that is a compare that rarely stores, where marking pages cost two stores
 * per call), in the store window they mark the (at most two) pages they start in. The members need no check and no
 * mark (BERM_GROUPED_LD / BERM_GROUPED_ST). When the range is in neither window, that unchecked code is skipped:
 * the group's run goes through the checked runner instead (berm_aot/emit/slowrun.py), every access checked by
 * BERM_LD / BERM_ST, so a trap is exactly the interpreter's. */
#define BERM_RANGE_IN(LO, SPAN, a, n) (((n) <= (SPAN) + 8) & ((uint64_t)((a) - (LO)) <= (SPAN) + 8 - (n)))
#define BERM_GROUP(g, W1, W2, base, lo, n)                                                          \
    (g = BERM_RANGE_IN(BERM_##W1##_LO, BERM_##W1##_SPAN, (base) + (uint64_t)(lo), (n))   ? 1      \
         : BERM_RANGE_IN(BERM_##W2##_LO, BERM_##W2##_SPAN, (base) + (uint64_t)(lo), (n)) ? 2      \
                                                                                          : 0)
#define BERM_GROUP_MARK(g, stack, base, first, last)                                                \
    do {                                                                                            \
        if (BERM_LIKELY(g == (stack))) {                                                            \
            uint64_t low_ = (base) + (uint64_t)(first);                                             \
            if (BERM_UNLIKELY(low_ < ctx->stack_low)) ctx->stack_low = low_;                        \
        } else if (g) {                                                                             \
            BERM_MARK((base) + (uint64_t)(first));                                                  \
            BERM_MARK((base) + (uint64_t)(last));                                                   \
        }                                                                                           \
    } while (0)
/* A group through sp at an instruction where every frame at one depth of this C frame has the same sp (a function
 * whose calls of itself run in its C frame, all made at one known sp: berm_aot/emit/frames.py, same_at_each_depth),
 * so the group's range is the same for all of them. `v` is the first depth whose range has not passed: the depths
 * of this C frame below it found theirs in the stack window (flag `stack`) and lowered stack_low over it (which only
 * falls during a run), so a frame there skips the check and the mark (`...`: BERM_GROUP and BERM_GROUP_MARK). Only
 * a pass at depth v itself moves v up, so every depth below v passed on its own. On recursive fib this puts one
 * compare of registers in place of two of a call's three (the range's, and the mark's with ctx->stack_low): 6.8%
 * fewer instructions. */
#define BERM_GROUP_LEVEL(v, g, stack, ...)                                                          \
    do {                                                                                            \
        if (BERM_LIKELY(depth < (v))) {                                                             \
            g = (stack);                                                                            \
        } else {                                                                                    \
            __VA_ARGS__;                                                                            \
            if (g == (stack) && depth == (v)) (v) = depth + 1;                                      \
        }                                                                                           \
    } while (0)
static __attribute__((noinline, cold)) int berm_load_slow(berm_ctx *ctx, uint64_t a, unsigned n, uint64_t *out) {
    BERM_LOCALS;
    if (!BERM_LOAD_OK(a, n)) return 0;
    uint64_t v = 0;
    memcpy(&v, M + a, n); /* little-endian: the low n bytes */
    *out = v;
    return 1;
}
static __attribute__((noinline, cold)) int berm_store_slow(berm_ctx *ctx, uint64_t a, unsigned n, uint64_t v) {
    BERM_LOCALS;
    if (BERM_IN_STORE(a, n)) {
        memcpy(M + a, &v, n);
        BERM_MARK(a);
    } else if (BERM_IN_STACK(a, n)) {
        memcpy(M + a, &v, n);
        BERM_MARK_STACK(a);
    } else {
        return 0;
    }
    return 1;
}
/* A member of a group whose check passed (the only way to reach it): no check, no mark. */
#define BERM_GROUPED_LD(dst, T, addr)           \
    do {                                        \
        T v_;                                   \
        memcpy(&v_, M + (addr), sizeof v_);     \
        dst = (uint64_t)(int64_t)v_;            \
    } while (0)
#define BERM_GROUPED_ST(T, addr, val)           \
    do {                                        \
        T v_ = (T)(val);                        \
        memcpy(M + (addr), &v_, sizeof v_);     \
    } while (0)
/* A member of a counted loop's group, in the loop's first copy (berm_aot/emit/loops.py): its group's flag g says
 * whether the loop's head found the group's range in a window; else the access takes its own check (out of line). */
#define BERM_G_LD(g, dst, T, addr, pc)                                                              \
    do {                                                                                            \
        uint64_t a_ = (addr);                                                                       \
        if (BERM_LIKELY(g)) {                                                                       \
            T v_;                                                                                   \
            memcpy(&v_, M + a_, sizeof v_);                                                         \
            dst = (uint64_t)(int64_t)v_;                                                            \
        } else {                                                                                    \
            uint64_t w_;                                                                            \
            if (!berm_load_slow(ctx, a_, sizeof(T), &w_)) BERM_FAULT(a_, BERM_LOAD, sizeof(T), pc); \
            dst = (uint64_t)(int64_t)(T)w_;                                                         \
        }                                                                                           \
    } while (0)
#define BERM_G_ST(g, T, addr, val, pc)                                                              \
    do {                                                                                            \
        uint64_t a_ = (addr);                                                                       \
        T v_ = (T)(val);                                                                            \
        if (BERM_LIKELY(g)) {                                                                       \
            memcpy(M + a_, &v_, sizeof v_);                                                         \
        } else if (!berm_store_slow(ctx, a_, sizeof(T), (uint64_t)v_)) {                           \
            BERM_FAULT(a_, BERM_STORE, sizeof(T), pc);                                              \
        }                                                                                           \
    } while (0)

/* Counted loops (berm_aot/emit/loops.py): a loop closed by `bne iv, bound` with `iv` stepped by `step` once per
 * iteration runs (bound - iv) / step iterations, iv read at its entry; 0 when that is not a whole number of at
 * most BERM_LOOP_MAX (its groups then leave every member to its own check). */
#define BERM_LOOP_MAX ((uint64_t)1 << 32)
static inline uint64_t berm_trips(uint64_t iv, uint64_t bound, int64_t step) {
    uint64_t d = step > 0 ? bound - iv : iv - bound;
    uint64_t s = step > 0 ? (uint64_t)step : -(uint64_t)step;
    if (d == 0 || d % s != 0) return 0; /* d == 0: the loop comes back to bound only after wrapping */
    return d / s <= BERM_LOOP_MAX ? d / s : 0;
}
/* A loop group: [first, first + n) is every byte its members touch in all `trips` iterations (n computed only
 * for trips >= 1). Then its stores account for themselves as a group's do (BERM_GROUP_MARK), over [low, low + span],
 * the addresses they start at: the stack's low-water mark, or a mark on every page of the store window in it. */
#define BERM_LOOP_GROUP(g, trips, W1, W2, first, n)   \
    do {                                              \
        if (trips)                                    \
            BERM_GROUP(g, W1, W2, first, 0, n);       \
        else                                          \
            g = 0;                                    \
    } while (0)
#define BERM_LOOP_MARK(g, stack, low, span)                                                            \
    do {                                                                                               \
        uint64_t low_ = (low);                                                                         \
        if (BERM_LIKELY(g == (stack))) {                                                               \
            if (BERM_UNLIKELY(low_ < ctx->stack_low)) ctx->stack_low = low_;                           \
        } else if (g) {                                                                                \
            for (uint64_t p_ = low_ >> BERM_PAGE_SHIFT; p_ <= (low_ + (span)) >> BERM_PAGE_SHIFT; p_++) \
                BERM_MARK(p_ << BERM_PAGE_SHIFT);                                                      \
        }                                                                                              \
    } while (0)

/* Atomics: naturally aligned, else a fault; then the load (lr) or store (everything else) bounds. */
#define BERM_ATOMIC_ADDR(a_, T, addr, store, pc)                                                    \
    uint64_t a_ = (addr);                                                                           \
    if (BERM_UNLIKELY(a_ & (sizeof(T) - 1))) BERM_FAULT(a_, BERM_MISALIGNED, sizeof(T), pc);        \
    if (BERM_UNLIKELY(!((store) ? BERM_STORE_OK(a_, sizeof(T)) : BERM_LOAD_OK(a_, sizeof(T)))))     \
        BERM_FAULT(a_, (store) ? BERM_STORE : BERM_LOAD, sizeof(T), pc)

#define BERM_TRAP(kind, pc, addr, detail)                 \
    do {                                                  \
        berm_set_trap(ctx, (kind), (pc), (addr), (detail)); \
        goto trap;                                        \
    } while (0)

/* An instruction that writes sp (the statement in the arguments): a value below the stack's lowest address is the
 * stack-exhausted trap at `pc`, with sp as it was and the value it would have had as the address (SEMANTICS.md:
 * a frame larger than the room left would skip the guard page and write the heap). */
#define BERM_SP_WRITE(pc, ...)                                                          \
    do {                                                                               \
        const uint64_t sp0_ = x2;                                                      \
        __VA_ARGS__                                                                    \
        if (BERM_UNLIKELY(x2 < BERM_STACK_LO)) {                                       \
            const uint64_t spn_ = x2;                                                  \
            x2 = sp0_;                                                                 \
            BERM_TRAP(BERM_TRAP_STACK, (pc), spn_, BERM_STACK_POINTER);                \
        }                                                                              \
    } while (0)

/* At function entry and on every back-edge: the watchdog's interrupt flag, at a constant offset from M (berm_rt.h,
 * BERM_INTERRUPT_AT), so that a loop polls it with the register its memory accesses use and needs none for ctx. */
#define BERM_POLL(pc)                                                                          \
    do {                                                                                       \
        if (BERM_UNLIKELY(*BERM_INTERRUPT_AT(M))) BERM_TRAP(BERM_TRAP_INTERRUPTED, (pc), 0, 0); \
    } while (0)

/* The host stack pointer, read without forcing a frame pointer (__builtin_frame_address(0) costs every
 * translated function a register and a push/pop pair). */
#if defined(__x86_64__)
#define BERM_HOST_SP(v) __asm__("mov %%rsp, %0" : "=r"(v))
#elif defined(__aarch64__)
#define BERM_HOST_SP(v) __asm__("mov %0, sp" : "=r"(v))
#else
#error "berm: translated code runs on x86-64 and AArch64 hosts (the core's native_stack.c)"
#endif

/* At function entry: the interrupt flag and the native stack's floor, in one compare (native_limit is raised past
 * any stack address once interrupted: berm_rt.h); the slow path is the two checks in full. */
#define BERM_ENTRY(pc)                                                                             \
    do {                                                                                           \
        uintptr_t sp_;                                                                             \
        BERM_HOST_SP(sp_);                                                                         \
        if (BERM_UNLIKELY(sp_ < ctx->native_limit)) {                                              \
            BERM_POLL(pc);                                                                         \
            if (sp_ < ctx->native_floor) BERM_TRAP(BERM_TRAP_STACK, (pc), 0, BERM_STACK_NATIVE);  \
        }                                                                                          \
    } while (0)

/* Before a call pushes a frame (the call passes depth + 1). */
#define BERM_PUSH(pc)                                                                                   \
    do {                                                                                                \
        if (BERM_UNLIKELY(depth >= BERM_MAX_CALL_DEPTH)) BERM_TRAP(BERM_TRAP_STACK, (pc), 0, BERM_STACK_DEPTH); \
    } while (0)

/* A call of the function by itself (at pc, to start) that writes its link with `link` and enters the new frame with
 * `enter`: BERM_PUSH, the link, the frame, then the poll of the entry — in that order, so a trap shows the registers
 * and the call chain the interpreter's does — with one compare on the fast path (depth_limit drops to 0 once
 * interrupted: berm_rt.h). */
#define BERM_SELF_CALL(pc, start, link, enter)             \
    do {                                                   \
        if (BERM_UNLIKELY(depth >= ctx->depth_limit)) {    \
            BERM_PUSH(pc);                                 \
            link;                                          \
            enter;                                         \
            BERM_POLL(start);                              \
        } else {                                           \
            link;                                          \
            enter;                                         \
        }                                                  \
    } while (0)

/* A trap's call chain (ctx->trace): each C frame's trap block records the frames it held, innermost first — `n`
 * frames expecting `link`, or (berm_trace_shadow) those whose expected links a function calling itself keeps at
 * shadow[from - 1] down to shadow[to]. The trace keeps the first BERM_TRACE_KEEP and counts them all. */
static __attribute__((cold, noinline, unused)) void berm_trace(berm_ctx *ctx, uint64_t link, uint32_t n) {
    for (; n; n--, ctx->trace_frames++)
        if (ctx->trace_frames < BERM_TRACE_KEEP) ctx->trace[ctx->trace_frames] = link;
}

static __attribute__((cold, noinline, unused)) void berm_trace_shadow(berm_ctx *ctx, uint32_t from, uint32_t to) {
    for (; from > to; from--, ctx->trace_frames++)
        if (ctx->trace_frames < BERM_TRACE_KEEP) ctx->trace[ctx->trace_frames] = ctx->shadow[from - 1];
}

#endif
