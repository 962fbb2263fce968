/* The tool boundary: arguments in, a result or a failure out, log lines, and the bounded output buffer. */
#include "berm.h"

#if defined(__riscv)
void berm_panic(const char *why) {
    berm_fail(why); /* the host shows it with the ebreak's trap (the trap decides the outcome) */
    __asm__ volatile("ebreak");
    __builtin_unreachable();
}
#endif

berm_str berm_cstr(const char *s) { return (berm_str){s, strlen(s)}; }

bool berm_str_eq(berm_str a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && memcmp(a.ptr, s, n) == 0;
}

size_t berm_args_len(void) { return (size_t)berm_host_call(BERM_CALL_ARGS_LEN, 0, 0); }

size_t berm_args_read(void *buf, size_t cap) {
    return (size_t)berm_host_call(BERM_CALL_ARGS_READ, (uint64_t)(uintptr_t)buf, cap);
}

berm_str berm_args(void) {
    size_t len = berm_args_len();
    char *buf = malloc(len + 1);
    if (!buf) return (berm_str){NULL, 0};
    berm_args_read(buf, len);
    buf[len] = 0;
    return (berm_str){buf, len};
}

berm_result_t berm_ok(const void *data, size_t len) {
    return (berm_result_t){(uint64_t)(uintptr_t)data, len};
}

berm_result_t berm_ok_str(const char *s) { return berm_ok(s, strlen(s)); }

berm_result_t berm_fail_n(const char *message, size_t len) {
    berm_host_call(BERM_CALL_FAIL, (uint64_t)(uintptr_t)message, len);
    return (berm_result_t){0, 0};
}

berm_result_t berm_fail(const char *message) { return berm_fail_n(message, strlen(message)); }

/* Formats into a stack buffer (the heap when the text is longer) and hands the text to `sink`; `complete` is
 * false when there was no memory for a long text and `text` is its truncated start. */
typedef void (*text_sink)(void *ctx, const char *text, size_t len, bool complete);

static void format_into(text_sink sink, void *ctx, const char *fmt, va_list ap) {
    char stack[256];
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(stack, sizeof stack, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n;
    char *heap = len >= sizeof stack ? malloc(len + 1) : NULL;
    if (heap) vsnprintf(heap, len + 1, fmt, again);
    va_end(again);
    if (heap) sink(ctx, heap, len, true);
    else sink(ctx, stack, len < sizeof stack ? len : sizeof stack - 1, len < sizeof stack);
    free(heap);
}

static void fail_sink(void *ctx, const char *text, size_t len, bool complete) {
    (void)ctx, (void)complete; /* a truncated message beats none */
    berm_fail_n(text, len);
}

static void log_sink(void *ctx, const char *text, size_t len, bool complete) {
    (void)ctx, (void)complete;
    berm_log(text, len);
}

static void buf_sink(void *ctx, const char *text, size_t len, bool complete) {
    berm_buf *b = ctx;
    if (complete) berm_buf_put(b, text, len);
    else b->oom = true; /* never a silently partial output */
}

berm_result_t berm_failf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_into(fail_sink, NULL, fmt, ap);
    va_end(ap);
    return (berm_result_t){0, 0};
}

void berm_log(const char *text, size_t len) {
    berm_host_call(BERM_CALL_LOG, (uint64_t)(uintptr_t)text, len);
}

void berm_logf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_into(log_sink, NULL, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- berm_buf */

void berm_buf_init(berm_buf *b, size_t limit) {
    *b = (berm_buf){.limit = limit ? limit : BERM_OUTPUT_LIMIT};
}

bool berm_buf_ok(const berm_buf *b) { return !b->overflow && !b->oom; }

/* Room for `extra` more bytes plus a NUL, growing geometrically up to the limit. */
static bool reserve(berm_buf *b, size_t extra) {
    if (!berm_buf_ok(b)) return false;
    if (extra > b->limit - b->len || extra >= SIZE_MAX - b->len) { /* (a limit of SIZE_MAX: no +1 wraps) */
        b->overflow = true;
        return false;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap <= SIZE_MAX / 2 ? cap * 2 : need;
    if (b->limit < SIZE_MAX && cap > b->limit + 1) cap = b->limit + 1;
    char *data = realloc(b->data, cap);
    /* Doubled past what the heap has: the most it has between that and just enough, the difference halved at each
     * try (found by a review: 40 MB of output in a 63 MB heap failed at the step from 32 to 64 MB). Just enough at
     * once left no room, and every later put failed a doubling again, each failure a walk of the heap: 1 MiB more
     * in 64-byte puts took 4.4 s with 200,000 small blocks live. */
    while (!data && cap > need) {
        cap = need + (cap - need) / 2;
        data = realloc(b->data, cap);
    }
    if (!data) {
        b->oom = true;
        return false;
    }
    b->data = data;
    b->cap = cap;
    return true;
}

void berm_buf_put(berm_buf *b, const void *data, size_t len) {
    /* bytes of the buffer itself (doubling what it holds) move when it grows: found again at their offset */
    uintptr_t at = (uintptr_t)data - (uintptr_t)b->data;
    bool inside = b->data && at < b->cap;
    if (!reserve(b, len)) return;
    if (inside) data = b->data + at;
    memmove(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = 0;
}

void berm_buf_puts(berm_buf *b, const char *s) { berm_buf_put(b, s, strlen(s)); }

/* One byte without a memcpy call: formatting loops put one separator per line, and a guest call costs more than a
 * one-byte copy once translated. */
void berm_buf_putc(berm_buf *b, char c) {
    if (!reserve(b, 1)) return;
    b->data[b->len++] = c;
    b->data[b->len] = 0;
}

void berm_buf_putu(berm_buf *b, uint64_t value) {
    char digits[20];
    size_t i = sizeof digits;
    do {
        digits[--i] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    berm_buf_put(b, digits + i, sizeof digits - i);
}

void berm_buf_vprintf(berm_buf *b, const char *fmt, va_list ap) { format_into(buf_sink, b, fmt, ap); }

void berm_buf_printf(berm_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    berm_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void berm_buf_free(berm_buf *b) {
    free(b->data);
    *b = (berm_buf){.limit = b->limit};
}

static berm_result_t fail_overflow(size_t limit) {
    return berm_failf("output exceeds the %zu-byte output buffer", limit);
}

berm_result_t berm_reply_result(const berm_reply *reply, size_t limit) {
    if (reply->error) return berm_fail(reply->error);
    if (reply->len > (limit ? limit : BERM_OUTPUT_LIMIT)) return fail_overflow(limit ? limit : BERM_OUTPUT_LIMIT);
    return berm_ok(reply->data, reply->len);
}

berm_result_t berm_buf_finish(berm_buf *b) {
    if (b->overflow) return fail_overflow(b->limit);
    if (b->oom) return berm_fail("out of memory while building the output");
    return berm_ok(b->data ? b->data : "", b->len);
}
