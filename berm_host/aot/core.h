/* The runtime core's interface to Python (cffi reads the declarations in _build.py; core.c implements them). */
#ifndef BERM_CORE_H
#define BERM_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "berm_rt.h"
#include "native_stack.h"

typedef struct berm_image berm_image;

/* How many separate ranges of core writes a region remembers byte-exact before marking whole pages. */
#define BERM_CORE_RANGES 4

/* An idle region keeps at most this much zero-initial memory (above the image's file bytes) resident: beyond it,
 * berm_region_trim hands it back to the kernel (madvise) instead of zeroing it in place. Counted in coarse blocks
 * (256 KiB) written since the last trim: 4 MiB per region, 64 MiB for a full pool of 16. Zeroing a resident page
 * costs ~0.1 us, refaulting a released one ~1.3 us: guests that keep reusing a few MiB stay on the fast path. */
#define BERM_RESIDENT_KEEP ((uint64_t)4 << 20)

/* The staging buffer of a region keeps up to this size between replies; a larger one is given back at the next
 * reply that fits in it. */
#define BERM_STAGE_KEEP ((uint64_t)1 << 20)

/* The longest berm.fail text kept (longer ones are cut here; the Python side adds the truncation marker). */
#define BERM_FAIL_KEEP ((uint64_t)64 << 10)

/* The longest berm.log line handed to the log sink (only these bytes are copied; the Python side adds the
 * truncation marker): a line the size of guest memory cost the host gigabytes and a minute in its sink. */
#define BERM_LOG_KEEP ((uint64_t)64 << 10)

/* The native stack translated code runs on, per region (native_stack.h): BERM_MAX_CALL_DEPTH nested calls of
 * frames up to ~400 bytes. Its pages cost memory only once a guest recursed that deep. */
#define BERM_NATIVE_STACK ((size_t)4 << 20)
/* Kept free below native_floor (the lowest address translated code may reach), besides two of the code's largest
 * frames (berm_region_code): the trap path, the core host calls and any signal handler that runs on this stack. */
#define BERM_NATIVE_MARGIN ((size_t)64 << 10)

/* One reusable guest memory region and the state of the invocation running in it. */
typedef struct berm_region {
    berm_ctx ctx; /* first: translated code sees only this part */
    const berm_image *image;
    void *enter;              /* the translated image's entry point (berm_load), set once per region */
    uint64_t int_args[8];     /* a0..a7 of the next invocation (the first n_int of them) */
    const char *args; /* the invocation's argument blob (owned by Python for the duration of the call) */
    uint8_t *staged; /* the last capability reply, for berm.result.read (grown to fit; see BERM_STAGE_KEEP) */
    uint64_t staged_len, staged_cap;
    uint64_t call_number, call_ptr, call_len; /* the host call being served in Python and its guest buffer */
    uint8_t *fail; /* the first BERM_FAIL_KEEP bytes of the last berm.fail text */
    uint64_t fail_len, fail_cap; /* fail_len: the full length the guest passed */
    int has_fail;
    uint64_t logged; /* bytes of berm.log lines this invocation's log sink received (counted in Python) */
    int used; /* memory may be dirty: reset before the next invocation */
    /* guest memory the core itself wrote (host-call buffers) since the last reset: [core_lo[i], core_hi[i]) */
    uint64_t core_lo[BERM_CORE_RANGES], core_hi[BERM_CORE_RANGES];
    int n_core;
    /* PyObject *: the callable serving berm.log and capabilities (berm_region_serve: borrowed), and the int object
     * of the last call number passed to it (calls repeat; a strong reference dropped by berm_region_release) */
    void *serve, *number_obj;
    uint64_t max_result; /* a readable result longer than this is BERM_RUN_BIG_RESULT (set by Python) */
    uint64_t size, npages, ncoarse;
    /* coarse blocks of zero-initial memory written since the last trim (blocks holding only file bytes preset) */
    uint8_t *touched;
    uint64_t n_touched;
    char trap_msg[200]; /* detail of a host-call-failed trap raised by the core */
    double deadline;    /* CLOCK_MONOTONIC seconds (time.monotonic()); 0 = none */
    int running;        /* set under the watchdog's lock, cleared by an atomic store */
    int busy;           /* a berm_run is using the region (taken by an atomic exchange) */
    uint64_t generation; /* counts runs (under the watchdog's lock): an interrupt names the run it is meant for */
    struct berm_region *prev, *next; /* every live region, for the watchdog */
    berm_native_stack native; /* what translated code runs on */
    uintptr_t host_sp; /* during a run: the host thread's stack pointer where it switched to `native` */
} berm_region;

/* Outcome of berm_run. */
enum {
    BERM_RUN_OK = 0,
    BERM_RUN_TRAPPED = 1,
    BERM_RUN_FAILED = 2,
    BERM_RUN_BAD_RESULT = 3,
    BERM_RUN_BIG_RESULT = 4,
    BERM_RUN_BUSY = 5, /* the region is running already: nothing was done */
};
/* Or'ed into berm_run's outcome: the region now holds more than BERM_RESIDENT_KEEP of written zero-initial memory;
 * call berm_region_trim once the result has been read, before pooling it. */
enum { BERM_RUN_TRIM = 8 };

/* API (begin): _build.py reads the declarations between these markers into cffi's cdef */
/* The constructors put what they make in their caller's `slot`, which owns it (the matching release frees what a
 * slot holds, if anything), and return 0 when out of memory. Python makes the slot, with its release attached,
 * before the call: a result handed back would sit in no owner for a moment, and an exception raised as the call
 * returns (a KeyboardInterrupt is, at the first chance after a C call) leaked it — a 64 MiB region each time,
 * left on the watchdog's list for good. */
int berm_image_new(berm_image **slot, uint64_t size, uint64_t image_lo, uint64_t writable_lo, uint64_t image_end,
                   uint64_t heap_start, uint64_t guard_lo, uint64_t stack_lo, const char *hull, uint64_t hull_len);
void berm_image_release(berm_image **slot);
int berm_region_new(berm_region **slot, const berm_image *im);
/* Hand the region the callable serving its berm.log and capability calls: `fn` is the address of a Python object
 * (id(fn)) that the caller keeps alive as long as the region may run (borrowed: see core.c). */
void berm_region_serve(berm_region *r, uintptr_t fn);
/* Stage `data` as the reply berm.result.read serves (the server's path for an error reply); returns n, or 0 with
 * the host-call-failed trap set when out of host memory. */
uint64_t berm_region_stage(berm_region *r, const char *data, uint64_t n);
void berm_region_release(berm_region **slot);
/* timeout: seconds from now until the watchdog interrupts the run (read on CLOCK_MONOTONIC here, which saves the
 * caller a clock read); <= 0 = none. */
/* Reset the region now (its next run starts clean) and release its zero-initial memory to the kernel, and the
 * pages of its native stack a deep recursion left resident. */
int berm_region_trim(berm_region *r); /* 0: refused, a run is using the region */
/* Interrupt run `generation` of the region if it is still running; 1 when the flag was set, 0 for a run that has
 * ended (the watchdog's path, also callable from Python). */
int berm_interrupt(berm_region *r, uint64_t generation);
int berm_run(berm_region *r, uint64_t entry, const char *args, uint64_t args_len, int n_int, double timeout);
/* The CLOCK_MONOTONIC instant (seconds) by which the runs going on in this thread must end (the earliest deadline of
 * a run and the runs it is nested in), 0 when none has one: a host call served now may take until then at most. */
double berm_thread_deadline(void);
/* Runs nested in host calls on one thread, at most: a run beyond traps as the host thread's stack exhausted, on
 * either engine (berm_host/running.py, MAX_NESTED_RUNS). */
#define BERM_MAX_NESTED_RUNS 64
/* How many runs are going on in this thread, of either engine. */
int berm_thread_runs(void);
/* An interpreted run starts on this thread (its host calls may start translated runs: they end by its deadline and
 * count it): 1, changing nothing, when it is nested too deep by the rule of translated runs (more than
 * BERM_MAX_NESTED_RUNS, or below the host stack's floor); else 0, with `deadline` (the earlier of its own and its
 * caller's; 0: none) this thread's deadline and the run counted. However the run ends, or its start is cut short,
 * berm_thread_restore puts back what berm_thread_deadline and berm_thread_runs read before it. */
int berm_thread_enter(double deadline);
/* Set this thread's deadline and run count: absolute values, so a restore is whole whatever part of a run's start
 * happened (a KeyboardInterrupt raised between two calls left a deadline or a count behind: found by a review). */
void berm_thread_restore(double deadline, int runs);
int berm_watchdog_start(double interval);
/* The six numbers of a translated object's layout export (berm_aot/windows.py, Windows). */
#define BERM_LAYOUT_WORDS 6
/* dlopen a translated object and return its `symbol` entry point, once its runtime ABI and the layout it was
 * translated for (the uint64_t[6] at `layout_symbol`) match this runtime and `layout`, and (unless `key` is NULL)
 * the cache key it was compiled under (berm_object_key: berm_aot/cc.py) is `key`; else NULL and a message.
 * *frame receives the object's largest native stack frame (berm_max_frame: berm_aot/cc.py) and the slot *handle
 * (its caller's, as the constructors' above) the object's dlopen handle, which keeps the code mapped until
 * berm_unload. */
void *berm_load(const char *path, const char *symbol, const char *layout_symbol, const uint64_t *layout,
                const char *key, uint64_t *frame, void **handle, char *err, size_t errlen);
/* The address of symbol `name` in the object of a handle berm_load gave (dlsym), NULL when it has none. */
void *berm_object_symbol(void *handle, const char *name);
/* Close the handle berm_load put in `handle` (dlclose), if it did: only once no region that runs its code can run
 * again. */
void berm_unload(void **handle);
/* Give a new region the code it runs: `enter` (berm_load) and that object's largest frame, which native_floor
 * keeps room for below it (a function's entry check may run once its frame is allocated). Returns 0 when such a
 * frame does not fit the native stack with room to spare (over an eighth of it). */
int berm_region_code(berm_region *r, void *enter, uint64_t frame);
/* API (end) */

#endif
