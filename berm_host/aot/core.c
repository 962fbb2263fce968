/* The runtime core: guest memory regions, invocation entry, the core host calls (with the bounds checks of
 * their buffers), and loading translated images. Built by cffi (berm_host/aot/_build.py) into berm_host.aot._core.
 *
 * No signal handler anywhere: translated code checks every access itself, so nothing here expects a fault.
 *
 * berm.log and capabilities are served in Python: the core calls the region's serving callable directly through
 * the CPython C API (one vectorcall of the call number and the request bytes, GIL taken for just that call; the
 * reply is staged here), which costs well under half what a cffi extern "Python" callback did.
 *
 * Memory is reused, not re-mapped (a page fault costs ~1.3 us here): every store marks its page in a byte map
 * (and a coarse map over 64 pages), and the next invocation on the region restores only those pages — from the
 * pristine image for pages inside the image hull, zero elsewhere. Untouched .bss costs nothing. Zeroing in place
 * keeps those pages resident, so a region that has written more than BERM_RESIDENT_KEEP of zero-initial memory is
 * trimmed instead (berm_region_trim: madvise, the kernel reads it back as zero) before it goes back to the pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as it asks; it defines _GNU_SOURCE */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "berm_rt.h"
#include "core.h"

#define PAGE ((uint64_t)1 << BERM_PAGE_SHIFT)
#define PAGES_PER_COARSE BERM_PAGES_PER_COARSE

struct berm_image {
    uint64_t size, image_lo, writable_lo, image_end, heap_start, guard_lo, stack_lo;
    uint64_t hull_lo;      /* image_lo rounded down to a page */
    uint64_t pristine_end; /* page-rounded end of the file bytes: .bss above it is zero and costs nothing */
    uint8_t *pristine;     /* [hull_lo, pristine_end): the initial bytes, zero-filled */
};

/* ---------------------------------------------------------------- images */

int berm_image_new(berm_image **slot, uint64_t size, uint64_t image_lo, uint64_t writable_lo, uint64_t image_end,
                   uint64_t heap_start, uint64_t guard_lo, uint64_t stack_lo, const char *hull, uint64_t hull_len) {
    berm_image *im = calloc(1, sizeof *im);
    if (!im) return 0;
    im->size = size;
    im->image_lo = image_lo;
    im->writable_lo = writable_lo;
    im->image_end = image_end;
    im->heap_start = heap_start;
    im->guard_lo = guard_lo;
    im->stack_lo = stack_lo;
    im->hull_lo = image_lo & ~(PAGE - 1);
    if (hull_len > heap_start - image_lo) hull_len = heap_start - image_lo;
    im->pristine_end = (image_lo + hull_len + PAGE - 1) & ~(PAGE - 1);
    uint64_t n = im->pristine_end - im->hull_lo;
    im->pristine = calloc(1, n ? n : 1);
    if (!im->pristine) {
        free(im);
        return 0;
    }
    memcpy(im->pristine + (image_lo - im->hull_lo), hull, hull_len);
    *slot = im;
    return 1;
}

void berm_image_release(berm_image **slot) {
    berm_image *im = *slot;
    *slot = NULL;
    if (!im) return;
    free(im->pristine);
    free(im);
}

/* ---------------------------------------------------------------- exact bounds */

static inline int range_ok(uint64_t a, uint64_t n, uint64_t lo, uint64_t hi) {
    return a >= lo && a <= hi && n <= hi - a;
}

static inline int readable(const berm_image *im, uint64_t a, uint64_t n) {
    return range_ok(a, n, im->image_lo, im->guard_lo) || range_ok(a, n, im->stack_lo, im->size);
}

static inline int writable(const berm_image *im, uint64_t a, uint64_t n) {
    return range_ok(a, n, im->writable_lo, im->guard_lo) || range_ok(a, n, im->stack_lo, im->size);
}

/* ---------------------------------------------------------------- dirty pages */

/* The fine map has one byte per page, padded to whole coarse blocks (PAGES_PER_COARSE bytes, a multiple of 8), so
 * the passes below read it 8 bytes at a time. */
static inline uint64_t load8(const uint8_t *p) {
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
}

static void mark_range(berm_region *r, uint64_t a, uint64_t n) {
    if (!n) return;
    for (uint64_t p = a >> BERM_PAGE_SHIFT; p <= (a + n - 1) >> BERM_PAGE_SHIFT; p++) {
        r->ctx.dirty[p] = 1;
        r->ctx.coarse[p / PAGES_PER_COARSE] = 1;
    }
}

/* Restore [a, a+n) (inside one page) to its initial contents. With `drop`, zero-initial memory (at or above the
 * image's file bytes) is left alone: the caller hands it back to the kernel, which reads it back as zero. */
static void restore(berm_region *r, uint64_t a, uint64_t n, int drop) {
    const berm_image *im = r->image;
    if (a >= im->hull_lo && a < im->pristine_end)
        memcpy(r->ctx.mem + a, im->pristine + (a - im->hull_lo), n);
    else if (!drop || a < im->hull_lo)
        memset(r->ctx.mem + a, 0, n);
}

/* Restore [a, end), any number of pages. */
static void restore_range(berm_region *r, uint64_t a, uint64_t end, int drop) {
    while (a < end) {
        uint64_t stop = (a | (PAGE - 1)) + 1;
        if (stop > end) stop = end;
        restore(r, a, stop - a, drop);
        a = stop;
    }
}

/* Note that the core wrote [a, a+n) of guest memory. The exact bytes are restored at the next reset, so a
 * 256-byte berm.args.read costs 256 bytes there, not the one or two whole pages it touches; a write that merges
 * with no remembered range and finds no free slot marks its pages instead. */
static void note_write(berm_region *r, uint64_t a, uint64_t n) {
    if (!n) return;
    uint64_t end = a + n;
    for (int i = 0; i < r->n_core; i++) {
        if (a <= r->core_hi[i] && end >= r->core_lo[i]) { /* overlapping or adjacent: widen */
            if (a < r->core_lo[i]) r->core_lo[i] = a;
            if (end > r->core_hi[i]) r->core_hi[i] = end;
            return;
        }
    }
    if (r->n_core < BERM_CORE_RANGES) {
        r->core_lo[r->n_core] = a;
        r->core_hi[r->n_core++] = end;
        return;
    }
    mark_range(r, a, n);
}

/* Translated stores into the stack window mark only the fine map (berm_code.h, BERM_MARK_STACK): set the coarse
 * bytes of the stack's dirty pages, and of the blocks from ctx.stack_low up (what groups of stores into the stack
 * wrote, BERM_GROUP_MARK; restored byte-exactly by reset_memory), so the coarse pass there and over_resident
 * see them. */
static void fold_stack_marks(berm_region *r) {
    const uint8_t *dirty = r->ctx.dirty;
    uint64_t low_block = r->ctx.stack_low >> BERM_COARSE_SHIFT; /* the end of memory when no group stored */
    /* whole blocks, 8 fine bytes at a time (the block holding stack_lo may hold heap pages: their marks set the
     * coarse byte already) */
    for (uint64_t cc = r->image->stack_lo >> BERM_COARSE_SHIFT; cc * PAGES_PER_COARSE < r->npages; cc++) {
        const uint8_t *d = dirty + cc * PAGES_PER_COARSE;
        uint64_t any = cc >= low_block;
        for (uint64_t i = 0; i < PAGES_PER_COARSE; i += 8) any |= load8(d + i);
        if (any) r->ctx.coarse[cc] = 1;
    }
}

/* Before a run (and at a trim): restore what the last run wrote. over_resident, after every run, has folded the
 * stack's fine marks into the coarse map already. */
static void reset_memory(berm_region *r, int drop) {
    if (r->ctx.stack_low < r->size) {
        /* the group's check put stack_low in the stack window; the clamp only guards the core against a bad one */
        uint64_t low = r->ctx.stack_low < r->image->stack_lo ? r->image->stack_lo : r->ctx.stack_low;
        restore_range(r, low, r->size, drop);
        uint64_t p = (low + PAGE - 1) >> BERM_PAGE_SHIFT; /* pages wholly restored just now: not again below */
        memset(r->ctx.dirty + p, 0, r->npages - p);
        r->ctx.stack_low = r->size;
    }
    for (int i = 0; i < r->n_core; i++) restore_range(r, r->core_lo[i], r->core_hi[i], drop);
    r->n_core = 0;
    uint8_t *coarse = r->ctx.coarse, *dirty = r->ctx.dirty;
    for (uint64_t c = 0; c < r->ncoarse; c += 8) {
        uint64_t word = load8(coarse + c); /* the coarse map is padded to a multiple of 8 */
        if (!word) continue;
        for (uint64_t cc = c; cc < c + 8; cc++) {
            if (!coarse[cc]) continue;
            coarse[cc] = 0;
            for (uint64_t p0 = cc * PAGES_PER_COARSE; p0 < (cc + 1) * PAGES_PER_COARSE; p0 += 8) {
                uint64_t marks = load8(dirty + p0); /* one byte per page, 0 or 1 */
                if (!marks) continue;
                memset(dirty + p0, 0, 8);
                for (; marks; marks &= marks - 1) {
                    uint64_t p = p0 + (uint64_t)__builtin_ctzll(marks) / 8;
                    restore(r, p << BERM_PAGE_SHIFT, PAGE, drop);
                    /* a store of up to 8 bytes at the end of page p spills into the start of page p+1 */
                    if (p + 1 < r->npages) restore(r, (p + 1) << BERM_PAGE_SHIFT, 8, drop);
                }
            }
        }
    }
}

/* Blocks below this one hold only the image's file bytes (memcpy'd at reset, bounded by the image): they are
 * preset in the touched map and never counted. */
static uint64_t first_zero_block(const berm_region *r) { return r->image->pristine_end >> BERM_COARSE_SHIFT; }

static void touched_clear(berm_region *r) {
    memset(r->touched, 0, r->ncoarse);
    memset(r->touched, 1, first_zero_block(r));
    r->n_touched = 0;
}

static void touch_block(berm_region *r, uint64_t cc) {
    if (!r->touched[cc]) {
        r->touched[cc] = 1;
        r->n_touched++;
    }
}

/* Add the blocks the last run wrote (its stores and the core's writes) to the touched map; returns whether the
 * region now keeps more than BERM_RESIDENT_KEEP resident. One pass over the coarse map, 8 blocks per step. */
static int over_resident(berm_region *r) {
    fold_stack_marks(r);
    uint8_t *coarse = r->ctx.coarse, *touched = r->touched;
    for (uint64_t c = 0; c < r->ncoarse; c += 8) {
        uint64_t word = load8(coarse + c), seen = load8(touched + c);
        uint64_t fresh = word & ~seen; /* bytes are 0 or 1 */
        if (!fresh) continue;
        seen |= fresh;
        memcpy(touched + c, &seen, 8);
        r->n_touched += (uint64_t)__builtin_popcountll(fresh);
    }
    for (int i = 0; i < r->n_core; i++)
        for (uint64_t cc = r->core_lo[i] >> BERM_COARSE_SHIFT; cc <= (r->core_hi[i] - 1) >> BERM_COARSE_SHIFT; cc++)
            touch_block(r, cc);
    return (r->n_touched << BERM_COARSE_SHIFT) > BERM_RESIDENT_KEEP;
}

int berm_region_trim(berm_region *r) {
    if (__atomic_exchange_n(&r->busy, 1, __ATOMIC_ACQUIRE)) return 0; /* a run is using it (berm_run) */
    const berm_image *im = r->image;
    reset_memory(r, 1);
    /* Everything from pristine_end up starts as zero, and reset_memory left it alone. madvise needs a start aligned
     * to the host's page, which may be 16 or 64 KiB where pristine_end is only 4 KiB-aligned: the bytes below that
     * start are zeroed by hand, and so is the rest if madvise fails (it is never left as the last run wrote it). */
    if (im->pristine_end < r->size) {
        uint64_t host_page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t from = (im->pristine_end + host_page - 1) & ~(host_page - 1);
        if (from > r->size) from = r->size;
        memset(r->ctx.mem + im->pristine_end, 0, from - im->pristine_end);
        if (from < r->size && madvise(r->ctx.mem + from, r->size - from, MADV_DONTNEED) != 0)
            memset(r->ctx.mem + from, 0, r->size - from);
    }
    touched_clear(r);
    r->used = 0;
    berm_native_stack_release(&r->native, BERM_NATIVE_MARGIN);
    __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
    return 1;
}

/* ---------------------------------------------------------------- host calls */

static __attribute__((noinline, cold)) void buffer_trap(berm_region *r, uint64_t pc, const char *call, uint64_t ptr,
                                                         uint64_t n, const char *access) {
    berm_set_trap(&r->ctx, BERM_TRAP_CALL_FAILED, pc, ptr, 0);
    snprintf(r->trap_msg, sizeof r->trap_msg, "%s: the buffer at 0x%llx (%llu bytes) is not %s guest memory",
             call, (unsigned long long)ptr, (unsigned long long)n, access);
}

/* memcpy for the few bytes a host call often copies (an 8-byte length prefix, a short reply): two overlapping
 * moves each, no call through the PLT into libc's memcpy (a third of a dispatched berm.args.read of 8 bytes). */
static inline void copy_bytes(uint8_t *to, const uint8_t *from, uint64_t n) {
    if (n >= 8 && n <= 16) {
        uint64_t head, tail;
        memcpy(&head, from, 8), memcpy(&tail, from + n - 8, 8);
        memcpy(to, &head, 8), memcpy(to + n - 8, &tail, 8);
    } else if (n >= 4 && n < 8) {
        uint32_t head, tail;
        memcpy(&head, from, 4), memcpy(&tail, from + n - 4, 4);
        memcpy(to, &head, 4), memcpy(to + n - 4, &tail, 4);
    } else if (n < 4) {
        for (uint64_t i = 0; i < n; i++) to[i] = from[i];
    } else {
        memcpy(to, from, n);
    }
}

/* Copy min(len, cap) bytes of src into guest memory at ptr; returns len, or sets the trap. Inlined into the
 * dispatch (core_ecall2: a call of its own took a fifth of one berm.args.read). */
static inline __attribute__((always_inline)) uint64_t copy_out(berm_region *r, uint64_t pc, const char *call,
                                                               uint64_t ptr, uint64_t cap, const uint8_t *src,
                                                               uint64_t len) {
    uint64_t n = len < cap ? len : cap;
    if (n) {
        if (BERM_UNLIKELY(!writable(r->image, ptr, n))) {
            buffer_trap(r, pc, call, ptr, n, "writable");
            return 0;
        }
        copy_bytes(r->ctx.mem + ptr, src, n);
        note_write(r, ptr, n);
    }
    return len;
}

static int grow(uint8_t **buf, uint64_t *cap, uint64_t need) {
    if (need <= *cap) return 1;
    uint64_t want = need < 256 ? 256 : need;
    uint8_t *p = realloc(*buf, want);
    if (!p) return 0;
    *buf = p;
    *cap = want;
    return 1;
}

/* ---------------------------------------------------------------- calls served in Python */

static double monotonic_now(void);

/* With the GIL held: turn the pending Python exception (or its absence) into the host-call-failed trap. One that is
 * not an Exception (KeyboardInterrupt, SystemExit: a signal handler runs as serve is entered, before its own
 * handler can catch anything) is also handed to serve's owner (HostCalls.pending), which raises it after the run,
 * as the interpreter lets it through; dropped here, Ctrl-C was lost in a guest calling capabilities. */
static void python_trap(berm_region *r, uint64_t n) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && !PyErr_GivenExceptionMatches(value, PyExc_Exception) && r->serve && PyMethod_Check(r->serve)) {
        PyObject *owner = PyMethod_GET_SELF((PyObject *)r->serve);
        if (PyObject_SetAttrString(owner, "pending", value) < 0) PyErr_Clear();
    }
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "SystemError";
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
    if (!msg) {
        PyErr_Clear(); /* an exception whose str() fails is still reported by its type */
        msg = type ? "(its message could not be read)" : "the callback returned no result";
    }
    berm_set_trap(&r->ctx, BERM_TRAP_CALL_FAILED, 0, n, 0);
    snprintf(r->trap_msg, sizeof r->trap_msg, "%s: %s", name, msg);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* With the GIL held (or from berm_region_stage): copy a reply into the staging buffer, a new one when it does not
 * fit or when a large one (over BERM_STAGE_KEEP) can be given back; returns n, or sets the trap. */
static uint64_t stage(berm_region *r, const char *data, uint64_t n) {
    if (r->staged_cap > BERM_STAGE_KEEP && n <= BERM_STAGE_KEEP) { /* give a large buffer back */
        free(r->staged);
        r->staged = NULL;
        r->staged_cap = r->staged_len = 0;
    }
    if (!grow(&r->staged, &r->staged_cap, n)) {
        berm_set_trap(&r->ctx, BERM_TRAP_CALL_FAILED, 0, r->call_number, 0);
        snprintf(r->trap_msg, sizeof r->trap_msg, "out of host memory for a reply of %llu bytes",
                 (unsigned long long)n);
        return 0;
    }
    if (n) memcpy(r->staged, data, n);
    r->staged_len = n; /* what berm.result.read copies from: never more than was staged */
    return n;
}

uint64_t berm_region_stage(berm_region *r, const char *data, uint64_t n) { return stage(r, data, n); }

/* The int object for call number n: the last one is kept, as a guest tends to call one capability in a loop. */
static PyObject *number_object(berm_region *r, uint64_t n) {
    PyObject *obj = r->number_obj;
    if (!obj || r->call_number != n) {
        obj = PyLong_FromUnsignedLongLong(n);
        if (!obj) return NULL;
        Py_XDECREF((PyObject *)r->number_obj);
        r->number_obj = obj;
    }
    r->call_number = n;
    Py_INCREF(obj);
    return obj;
}

/* serve(number, request) on this thread (the GIL is released while guest code runs): `request` is the guest
 * buffer (a0, a1) as bytes (a berm.log line: its first BERM_LOG_KEEP bytes), or None when it is not readable guest
 * memory (call_ptr and call_len name it, with the full length). A bytes
 * result is the reply, staged here (the guest's a0 is its length); an int is the guest's a0; a trap the server
 * records lands in the context. Any exception that escapes the server, and any other result, becomes the
 * host-call-failed trap, never an escape into translated code. */
static uint64_t serve_in_python(berm_region *r, uint64_t n, uint64_t a0, uint64_t a1, int ok) {
    uint64_t ret = 0;
    PyGILState_STATE gil = PyGILState_Ensure();
    if (!r->serve) {
        berm_set_trap(&r->ctx, BERM_TRAP_CALL_FAILED, 0, n, 0);
        snprintf(r->trap_msg, sizeof r->trap_msg, "no Python callable serves this region's host calls");
        PyGILState_Release(gil);
        return 0;
    }
    r->call_ptr = a0;
    r->call_len = a1;
    PyObject *argv[3] = {NULL, number_object(r, n), NULL};
    if (ok) {
        uint64_t keep = n == BERM_CALL_LOG && a1 > BERM_LOG_KEEP ? BERM_LOG_KEEP : a1;
        argv[2] = PyBytes_FromStringAndSize((const char *)r->ctx.mem + a0, (Py_ssize_t)keep);
    } else {
        argv[2] = Py_None;
        Py_INCREF(Py_None);
    }
    PyObject *res = NULL;
    if (argv[1] && argv[2])
        res = PyObject_Vectorcall((PyObject *)r->serve, argv + 1, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_XDECREF(argv[1]);
    Py_XDECREF(argv[2]);
    if (res) {
        if (PyBytes_CheckExact(res)) ret = stage(r, PyBytes_AS_STRING(res), (uint64_t)PyBytes_GET_SIZE(res));
        else ret = PyLong_AsUnsignedLongLong(res);
        Py_DECREF(res);
    }
    if (!res || PyErr_Occurred()) {
        python_trap(r, n);
        ret = 0;
    }
    PyGILState_Release(gil);
    return ret;
}

struct python_call {
    berm_region *r;
    uint64_t n, a0, a1;
    int ok;
};

static uint64_t python_call_on_host_stack(void *p) {
    struct python_call *c = p;
    return serve_in_python(c->r, c->n, c->a0, c->a1, c->ok);
}

/* From translated code, on the region's native stack: the Python part runs on the host thread's stack again, just
 * below the frame that entered the guest, with all the room the thread had then (native_stack.h). */
static uint64_t py_ecall(berm_region *r, uint64_t n, uint64_t a0, uint64_t a1, int ok) {
    struct python_call call = {r, n, a0, a1, ok};
    uintptr_t native_sp;
    return berm_switch_call(berm_resume_top(r->host_sp), python_call_on_host_stack, &call, &native_sp);
}

/* Borrowed, not owned: the region's Python owner keeps the callable alive (runtime.py, Region.serve), so a cycle
 * through it (a capability or log sink that refers back to the harness that owns the region) is one the garbage
 * collector can see and free. A reference held here would hide the cycle and keep the region mapped forever. */
void berm_region_serve(berm_region *r, uintptr_t fn) { r->serve = (void *)fn; }

/* Drop the region's reference to a Python object (berm_region_release; the interpreter may be gone at exit). */
static void drop_number(berm_region *r) {
    r->serve = NULL;
    if (!r->number_obj || !Py_IsInitialized()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF((PyObject *)r->number_obj);
    r->number_obj = NULL;
    PyGILState_Release(gil);
}

/* ---------------------------------------------------------------- the core host calls */

static uint64_t core_ecall2(berm_ctx *c, uint64_t pc, uint64_t n, uint64_t a0, uint64_t a1);

static uint64_t core_ecall(berm_ctx *c, uint64_t pc, uint64_t n, uint64_t a0, uint64_t a1, uint64_t a2,
                           uint64_t a3, uint64_t a4, uint64_t a5) {
    (void)a2, (void)a3, (void)a4, (void)a5;
    berm_region *r = (berm_region *)c;
    switch (n) {
    case BERM_CALL_ARGS_LEN:
        return c->args_len;
    case BERM_CALL_ARGS_READ:
    case BERM_CALL_RESULT_READ: /* the copies: core_ecall2 serves them */
        return core_ecall2(c, pc, n, a0, a1);
    case BERM_CALL_HEAP_START:
        return c->heap_start;
    case BERM_CALL_HEAP_SIZE:
        return c->heap_size;
    case BERM_CALL_FAIL:
        if (a1 && !readable(r->image, a0, a1)) {
            buffer_trap(r, pc, "berm.fail", a0, a1, "readable");
            return 0;
        }
        uint64_t keep = a1 < BERM_FAIL_KEEP ? a1 : BERM_FAIL_KEEP;
        if (!grow(&r->fail, &r->fail_cap, keep)) {
            berm_set_trap(c, BERM_TRAP_CALL_FAILED, pc, a0, 0);
            snprintf(r->trap_msg, sizeof r->trap_msg, "berm.fail: out of host memory for %llu bytes",
                     (unsigned long long)a1);
            return 0;
        }
        if (keep) memcpy(r->fail, c->mem + a0, keep);
        r->fail_len = a1;
        r->has_fail = 1;
        return 0;
    default: { /* berm.log and capabilities: Python. A capability's reply (or error text) is staged by now
                * (stage() sets staged_len); a capability that staged nothing leaves no reply to read. */
        if (n != BERM_CALL_LOG) r->staged_len = 0;
        uint64_t ret = py_ecall(r, n, a0, a1, !a1 || readable(r->image, a0, a1));
        if (c->trap_kind != BERM_TRAP_NONE) c->trap_pc = pc; /* a trap raised by Python names the ecall */
        else if (r->deadline > 0 && monotonic_now() > r->deadline) /* it blocked past the deadline: as the */
            berm_set_trap(c, BERM_TRAP_INTERRUPTED, pc, 0, 0);      /* interpreter, trap at the ecall */
        return ret;
    }
    }
}

/* Two-argument calls whose number the translator knew (ctx->ecall2): five arguments travel in registers where
 * core_ecall's nine put three on the stack, and the two copies skip the dispatch of every other call (core_ecall
 * sends them here too). */
static uint64_t core_ecall2(berm_ctx *c, uint64_t pc, uint64_t n, uint64_t a0, uint64_t a1) {
    berm_region *r = (berm_region *)c;
    if (n == BERM_CALL_ARGS_READ)
        return copy_out(r, pc, "berm.args.read", a0, a1, (const uint8_t *)r->args, c->args_len);
    if (n == BERM_CALL_RESULT_READ) return copy_out(r, pc, "berm.result.read", a0, a1, r->staged, r->staged_len);
    return core_ecall(c, pc, n, a0, a1, 0, 0, 0, 0);
}

/* ---------------------------------------------------------------- the watchdog */

/* Every live region, so the watchdog thread (one for the process, started from berm_host/watchdog.py) can set
 * the interrupt flag of an invocation past its deadline. berm_run takes the lock only to start. */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static berm_region *live;
static double watchdog_interval = 0.01;

static double monotonic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* With live_lock held: set the interrupt flag of run `generation` if that run is still going. Runs start (and bump
 * the generation, and clear the flag) under the lock, so a request for an ended run never reaches a later one. */
static int interrupt_locked(berm_region *r, uint64_t generation) {
    if (r->generation != generation || !__atomic_load_n(&r->running, __ATOMIC_ACQUIRE)) return 0;
    *r->ctx.interrupt = 1;
    /* after the flag. On x86-64 code that sees a limit drop then sees the flag too; elsewhere its slow path may
     * not yet, finds nothing to trap on, and goes on to the next poll, which sees it */
    __atomic_store_n(&r->ctx.native_limit, UINTPTR_MAX, __ATOMIC_RELEASE);
    __atomic_store_n(&r->ctx.depth_limit, 0, __ATOMIC_RELEASE);
    return 1;
}

int berm_interrupt(berm_region *r, uint64_t generation) {
    pthread_mutex_lock(&live_lock);
    int done = interrupt_locked(r, generation);
    pthread_mutex_unlock(&live_lock);
    return done;
}

static void *watchdog_main(void *arg) {
    (void)arg;
    struct timespec pause = {(time_t)watchdog_interval, (long)((watchdog_interval - (time_t)watchdog_interval) * 1e9)};
    for (;;) {
        nanosleep(&pause, NULL);
        double now = monotonic_now();
        pthread_mutex_lock(&live_lock);
        for (berm_region *r = live; r; r = r->next)
            if (r->deadline > 0 && now >= r->deadline) interrupt_locked(r, r->generation);
        pthread_mutex_unlock(&live_lock);
    }
    return NULL;
}

/* The process that owns the watchdog thread: a forked child has no thread (and must start its own). */
static pid_t watchdog_pid;

/* Held while the watchdog thread is being started. */
static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held around this core's dlopen, dlsym and dlclose (berm_load, berm_object_symbol, berm_unload): a child forked
 * while another thread was in the dynamic loader inherits the loader's own lock held, and its first dlopen never
 * returns. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;

/* Fork with these locks held by no one: take them around fork() so the child inherits them unlocked, and no load
 * of ours is halfway through the loader (a fork while another thread started the watchdog, or loaded an image,
 * left the child hung at its own first load). */
static void fork_prepare(void) {
    pthread_mutex_lock(&load_lock);
    pthread_mutex_lock(&start_lock);
    pthread_mutex_lock(&live_lock);
}
static void fork_release(void) {
    pthread_mutex_unlock(&live_lock);
    pthread_mutex_unlock(&start_lock);
    pthread_mutex_unlock(&load_lock);
}

/* Registered as the module loads, before anything can take the locks (registering takes the C library's own
 * fork-handler lock, which a fork in another thread holds while it waits for ours). */
__attribute__((constructor)) static void register_fork_handlers(void) {
    pthread_atfork(fork_prepare, fork_release, fork_release);
}

int berm_watchdog_start(double interval) {
    pthread_mutex_lock(&start_lock);
    int ok = 1;
    if (watchdog_pid != getpid()) {
        if (interval > 0) watchdog_interval = interval;
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 64 << 10);
        ok = pthread_create(&t, &attr, watchdog_main, NULL) == 0;
        pthread_attr_destroy(&attr);
        if (ok) watchdog_pid = getpid();
    }
    pthread_mutex_unlock(&start_lock);
    return ok;
}

/* ---------------------------------------------------------------- regions */

int berm_region_new(berm_region **slot, const berm_image *im) {
    berm_region *r = calloc(1, sizeof *r);
    if (!r) return 0;
    r->image = im;
    r->max_result = UINT64_MAX;
    r->size = im->size;
    r->npages = im->size >> BERM_PAGE_SHIFT;
    r->ncoarse = BERM_COARSE_BYTES(im->size);
    r->touched = malloc(r->ncoarse);
    r->ctx.shadow = malloc((BERM_MAX_CALL_DEPTH + 1) * sizeof *r->ctx.shadow);
    int stack_ok = berm_native_stack_new(&r->native, BERM_NATIVE_STACK);
    /* the dirty maps, then guest memory (berm_rt.h, BERM_MAPS_BYTES) */
    uint8_t *base = mmap(NULL, BERM_MAPS_BYTES(im->size) + im->size, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!r->touched || !r->ctx.shadow || !stack_ok || base == MAP_FAILED) {
        if (base != MAP_FAILED) munmap(base, BERM_MAPS_BYTES(im->size) + im->size);
        berm_native_stack_free(&r->native);
        free(r->touched);
        free(r->ctx.shadow);
        free(r);
        return 0;
    }
    r->ctx.dirty = base;
    r->ctx.coarse = base + BERM_FINE_BYTES(im->size);
    r->ctx.mem = base + BERM_MAPS_BYTES(im->size);
    r->ctx.interrupt = BERM_INTERRUPT_AT(r->ctx.mem);
    touched_clear(r);
    /* copy in the non-zero pages of the image; zero pages (.bss) stay untouched */
    for (uint64_t a = im->hull_lo; a < im->pristine_end; a += PAGE) {
        const uint8_t *src = im->pristine + (a - im->hull_lo);
        for (uint64_t i = 0; i < PAGE; i++) {
            if (src[i]) {
                memcpy(r->ctx.mem + a, src, PAGE);
                break;
            }
        }
    }
    berm_ctx *c = &r->ctx;
    c->stack_low = im->size; /* no stack store yet */
    c->native_floor = r->native.lo + BERM_NATIVE_MARGIN; /* raised by the code's largest frame: berm_region_code */
    c->heap_start = im->heap_start;
    c->heap_size = im->guard_lo - im->heap_start;
    pthread_mutex_lock(&live_lock);
    r->next = live;
    if (live) live->prev = r;
    live = r;
    pthread_mutex_unlock(&live_lock);
    c->ecall = core_ecall;
    c->ecall2 = core_ecall2;
    *slot = r;
    return 1;
}

int berm_region_code(berm_region *r, void *enter, uint64_t frame) {
    if (frame > BERM_NATIVE_STACK / 8) return 0;
    r->enter = enter;
    /* Two frames: one function may pass its check before allocating its frame (gcc's shrink-wrapping may move the
     * prologue past it) and call one that allocates first and checks after. */
    r->ctx.native_floor = r->native.lo + BERM_NATIVE_MARGIN + 2 * frame;
    return 1;
}

void berm_region_release(berm_region **slot) {
    berm_region *r = *slot;
    *slot = NULL;
    if (!r) return;
    pthread_mutex_lock(&live_lock);
    if (r->prev) r->prev->next = r->next;
    else live = r->next;
    if (r->next) r->next->prev = r->prev;
    pthread_mutex_unlock(&live_lock);
    drop_number(r);
    /* never r->image: it may be freed first at interpreter exit */
    munmap(r->ctx.dirty, BERM_MAPS_BYTES(r->size) + r->size);
    berm_native_stack_free(&r->native);
    free(r->touched);
    free(r->ctx.shadow);
    free(r->fail);
    free(r->staged);
    free(r);
}

/* Thread-local state the core reads on every run: in the initial-exec model, one load from the thread pointer
 * (this module's few bytes fit the static TLS space the C library keeps for modules loaded later), where the default
 * for a shared object calls __tls_get_addr each time (~20 ns per invocation in all). */
#define BERM_TLS __attribute__((tls_model("initial-exec")))

/* ---------------------------------------------------------------- the host thread's stack */

/* Translated code runs on its region's stack, but the Python code a host call runs, and any run it starts in turn
 * (a capability that calls a harness), use the host thread's: a run starts only above a floor, the stack's bottom
 * plus a margin for the Python code that then runs at the bottom (a quarter of the stack, 64 KiB to 1 MiB). Below
 * it, nesting runs inside host calls is the stack trap, not a crash. Kept per thread, with the stack it is for:
 * recomputed when the stack pointer is outside that stack (a library that runs code on stacks of its own). */
static __thread BERM_TLS struct { uintptr_t lo, hi, floor; } host_stack;

static uintptr_t host_stack_floor(uintptr_t here) {
    if (here >= host_stack.lo && here < host_stack.hi) return host_stack.floor;
    pthread_attr_t attr;
    void *lo;
    size_t size;
    int known = pthread_getattr_np(pthread_self(), &attr) == 0;
    if (known) {
        known = pthread_attr_getstack(&attr, &lo, &size) == 0 && (uintptr_t)lo < here && here < (uintptr_t)lo + size;
        pthread_attr_destroy(&attr);
    }
    if (!known) return here > ((uintptr_t)1 << 20) ? here - ((uintptr_t)1 << 20) : 0; /* 1 MiB from here */
    uintptr_t margin = size / 4;
    if (margin > ((uintptr_t)1 << 20)) margin = (uintptr_t)1 << 20;
    if (margin < ((uintptr_t)64 << 10)) margin = (uintptr_t)64 << 10;
    host_stack.lo = (uintptr_t)lo;
    host_stack.hi = (uintptr_t)lo + size;
    host_stack.floor = (uintptr_t)lo + margin;
    /* an "unlimited" main-thread stack is not all mapped: never go deeper than 256 MiB */
    if (size > ((uintptr_t)256 << 20)) host_stack.floor = host_stack.hi - ((uintptr_t)256 << 20);
    return host_stack.floor;
}

/* ---------------------------------------------------------------- invocation */

struct guest_entry {
    berm_enter_fn enter;
    berm_ctx *ctx;
    uint64_t entry;
};

static uint64_t enter_on_native_stack(void *p) {
    struct guest_entry *e = p;
    return e->enter(e->ctx, e->entry);
}

/* The earliest deadline of the runs going on in this thread (0: none), for berm_thread_deadline. */
static __thread BERM_TLS double thread_deadline;
/* How many runs are going on in this thread, interpreted ones too: a run is nested in a host call of another when
 * this is not 0. Only a nested run is held to the host stack's floor: a first run does not grow that stack (a
 * thread of 64 KiB, all of it below the floor's margin, trapped every run as "nested" when nothing was). */
static __thread BERM_TLS int thread_runs;

/* Whether a run starting here, on the host thread's stack at `here`, is nested in host calls too deeply: as many as
 * the interpreter allows (Python's recursion limit came first at 166 runs there, 245 here), or as the host stack
 * holds. The rule of both engines' runs. */
static int nested_too_deep(uintptr_t here) {
    return thread_runs && (thread_runs >= BERM_MAX_NESTED_RUNS || here < host_stack_floor(here));
}

int berm_thread_runs(void) { return thread_runs; }

double berm_thread_deadline(void) { return thread_deadline; }

int berm_thread_enter(double deadline) {
    if (nested_too_deep((uintptr_t)__builtin_frame_address(0))) return 1;
    thread_deadline = deadline;
    thread_runs++;
    return 0;
}

void berm_thread_restore(double deadline, int runs) {
    thread_deadline = deadline;
    thread_runs = runs;
}

int berm_run(berm_region *r, uint64_t entry, const char *args, uint64_t args_len, int n_int, double timeout) {
    /* One run per region at a time (the pool's rule): a second one would reset the first's memory and share its
     * native stack. Refused, not trusted. */
    if (__atomic_exchange_n(&r->busy, 1, __ATOMIC_ACQUIRE)) return BERM_RUN_BUSY;
    double deadline = timeout > 0 ? monotonic_now() + timeout : 0;
    double outer_deadline = thread_deadline; /* a run nested in a host call ends by its caller's deadline too */
    if (outer_deadline > 0 && (deadline == 0 || outer_deadline < deadline)) deadline = outer_deadline;
    berm_ctx *c = &r->ctx;
    if (r->used) reset_memory(r, 0);
    r->used = 1;
    memset(c->regs, 0, sizeof c->regs);
    c->regs[2] = r->image->size - 16;
    for (int i = 0; i < n_int && i < 8; i++) c->regs[10 + i] = r->int_args[i];
    r->args = args;
    c->args_len = args_len;
    r->staged_len = 0;
    r->has_fail = 0;
    r->logged = 0;
    r->fail_len = 0;
    r->trap_msg[0] = 0;
    c->trap_kind = BERM_TRAP_NONE;
    c->trap_pc = c->trap_addr = 0;
    c->trap_detail = 0;
    c->trace_frames = 0;
    pthread_mutex_lock(&live_lock);
    r->deadline = deadline;
    *c->interrupt = 0;
    c->native_limit = c->native_floor;
    c->depth_limit = BERM_MAX_CALL_DEPTH;
    r->generation++;
    r->running = 1;
    pthread_mutex_unlock(&live_lock);
    thread_deadline = deadline;
    uint64_t t;
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    if (nested_too_deep(here)) {
        berm_set_trap(c, BERM_TRAP_STACK, entry, 0, BERM_STACK_HOST);
        t = BERM_TRAPPED;
    } else {
        struct guest_entry e = {r->enter, c, entry};
        thread_runs++;
        t = berm_switch_call(r->native.top, enter_on_native_stack, &e, &r->host_sp);
        thread_runs--;
    }
    /* No lock to stop: a watchdog that still saw this run as running may set the interrupt flag of the idle
     * region, and the next run clears it under the lock (after that scan has released it). */
    __atomic_store_n(&r->running, 0, __ATOMIC_RELEASE);
    thread_deadline = outer_deadline;
    if (r->staged_cap > BERM_STAGE_KEEP) { /* a large reply is not kept for an idle region (it may be pooled) */
        free(r->staged);
        r->staged = NULL;
        r->staged_cap = r->staged_len = 0;
    }
    int trim = over_resident(r) ? BERM_RUN_TRIM : 0;
    __atomic_store_n(&r->busy, 0, __ATOMIC_RELEASE);
    if (t == BERM_TRAPPED) return BERM_RUN_TRAPPED | trim;
    if (r->has_fail) return BERM_RUN_FAILED | trim;
    /* no bytes are read from nowhere, wherever they point (as a host call's empty buffer): Layout.holds_result */
    if (c->regs[11] && !readable(r->image, c->regs[10], c->regs[11])) return BERM_RUN_BAD_RESULT | trim;
    return (c->regs[11] > r->max_result ? BERM_RUN_BIG_RESULT : BERM_RUN_OK) | trim;
}

/* ---------------------------------------------------------------- translated images */

void *berm_load(const char *path, const char *symbol, const char *layout_symbol, const uint64_t *layout,
                const char *key, uint64_t *frame, void **handle, char *err, size_t errlen) {
    pthread_mutex_lock(&load_lock);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    pthread_mutex_unlock(&load_lock);
    if (!h) {
        snprintf(err, errlen, "%s", dlerror());
        return NULL;
    }
    const int *abi = berm_object_symbol(h, "berm_rt_abi");
    void *enter = berm_object_symbol(h, symbol);
    const uint64_t *built_for = berm_object_symbol(h, layout_symbol);
    const unsigned long long *max_frame = berm_object_symbol(h, "berm_max_frame");
    const char *built_key = key ? berm_object_symbol(h, "berm_object_key") : NULL;
    if (abi && *abi != BERM_RT_ABI) { /* first: what an object of another runtime lacks is no news */
        snprintf(err, errlen, "%s was built for runtime ABI %d, this runtime is %d", path, *abi, BERM_RT_ABI);
    } else if (!abi || !enter || !built_for || !max_frame) {
        snprintf(err, errlen, "%s is not a translated image (no berm_rt_abi, berm_max_frame, %s or %s)", path, symbol,
                 layout_symbol);
    } else if (key && (!built_key || strcmp(built_key, key) != 0)) {
        /* an entry renamed under another image's key: its code is valid, but not this image's */
        snprintf(err, errlen, "%s was compiled for another image (cache key %.16s..., not %.16s...): a misfiled "
                 "code cache entry; remove it", path, built_key ? built_key : "(none)", key);
    } else if (memcmp(built_for, layout, BERM_LAYOUT_WORDS * sizeof *layout) != 0) {
        /* the code checks bounds against constants (berm_code.h): run on other memory, they would be wrong. Named by
         * the first word that differs (the stack window's alone said "at 0xc0000, not 0xc0000" when the data's
         * windows differed: found by a review) */
        static const char *const names[BERM_LAYOUT_WORDS] = {"load window's start", "load window's span",
                                                             "store window's start", "store window's span",
                                                             "stack window's start", "stack window's span"};
        int w = 0;
        while (built_for[w] == layout[w]) w++;
        snprintf(err, errlen, "%s was translated for another memory layout (its %s is 0x%llx, this memory's 0x%llx)",
                 path, names[w], (unsigned long long)built_for[w], (unsigned long long)layout[w]);
    } else {
        *frame = *max_frame;
        *handle = h;
        return enter;
    }
    berm_unload(&h);
    return NULL;
}

void *berm_object_symbol(void *handle, const char *name) {
    pthread_mutex_lock(&load_lock);
    void *p = dlsym(handle, name);
    pthread_mutex_unlock(&load_lock);
    return p;
}

void berm_unload(void **handle) {
    void *h = *handle;
    *handle = NULL;
    if (!h) return;
    pthread_mutex_lock(&load_lock);
    dlclose(h);
    pthread_mutex_unlock(&load_lock);
}
