/* berm.h — the C guest SDK for Berm harnesses (shared/ABI.md, version 0).
 *
 * A harness author writes tool functions and nothing else:
 *
 *     #include "berm.h"
 *     BERM_TOOL(echo) {
 *         berm_str args = berm_args();
 *         ...
 *         return berm_ok(text, len);          // or: return berm_fail("what went wrong");
 *     }
 *
 * `berm build` supplies _start, the .berm.abi manifest and the host-call numbers (berm_calls.h, generated from
 * berm_abi/names.py). Errors are values: functions that can fail return a struct whose `error` is a
 * heap-allocated, NUL-terminated message, or NULL on success.
 *
 * The same sources build for the host (not __riscv): host calls then go to berm_host_call(), which a test shim
 * provides (harnesses/sdk/host/shim.c), so tools can be tested natively.
 */
#ifndef BERM_H
#define BERM_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "berm_calls.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- host calls */

/** Bit 63 of a capability's return value: the staged bytes are an error message. */
#define BERM_ERROR_BIT (1ULL << 63)

#if defined(__riscv)
/* ecall: number in a7, arguments in a0/a1, result in a0; nothing else changes (docs/SEMANTICS.md). */
static inline uint64_t berm_host_call(uint64_t number, uint64_t arg0, uint64_t arg1) {
    register uint64_t a7 __asm__("a7") = number;
    register uint64_t a0 __asm__("a0") = arg0;
    register uint64_t a1 __asm__("a1") = arg1;
    __asm__ volatile("ecall" : "+r"(a0) : "r"(a7), "r"(a1) : "memory");
    return a0;
}
#else
uint64_t berm_host_call(uint64_t number, uint64_t arg0, uint64_t arg1);
#endif

/** Stop the invocation: a trap on the guest, after recording `why` with berm.fail (the host shows it with the
 *  trap), a recorded panic in the host shim. */
__attribute__((noreturn)) void berm_panic(const char *why);

/* ---------------------------------------------------------------- strings and results */

/** A byte string that is not necessarily NUL-terminated. */
typedef struct {
    const char *ptr;
    size_t len;
} berm_str;

#define BERM_STR(literal) ((berm_str){(literal), sizeof(literal) - 1})
berm_str berm_cstr(const char *s);
bool berm_str_eq(berm_str a, const char *s);

/** A key and its value: environment variables, HTTP headers. */
typedef struct {
    berm_str key, value;
} berm_pair;

/** What a tool returns: (ptr, len) in a0/a1. */
typedef struct {
    uint64_t ptr, len;
} berm_result_t;

/** Declare a tool: `BERM_TOOL(echo) { ... }` defines berm_tool_echo, listed in harness.toml. */
#define BERM_TOOL(name) berm_result_t berm_tool_##name(void)

/* ---------------------------------------------------------------- the tool boundary */

size_t berm_args_len(void);
/** Copies min(len, cap) argument bytes into buf; returns the full length. */
size_t berm_args_read(void *buf, size_t cap);
/** The whole argument blob in heap memory (NUL-terminated); ptr is NULL only when memory ran out. */
berm_str berm_args(void);

/** Return `len` bytes at `data` as the tool's result (they must stay valid: heap or static memory). */
berm_result_t berm_ok(const void *data, size_t len);
berm_result_t berm_ok_str(const char *s);
/** Fail the tool with a message (berm.fail); returns an empty result for `return berm_fail(...)`. */
berm_result_t berm_fail(const char *message);
berm_result_t berm_fail_n(const char *message, size_t len);
berm_result_t berm_failf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void berm_log(const char *text, size_t len);
void berm_logf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- output buffer */

/** Default limit of a berm_buf: 1 MiB of output. */
#define BERM_OUTPUT_LIMIT (1u << 20)

/** A growable output buffer with a hard limit. Writing past the limit (or running out of memory) marks the
 *  buffer failed; berm_buf_finish then fails the tool saying so, never returning a silently partial result. */
typedef struct {
    char *data;
    size_t len, cap, limit;
    bool overflow, oom;
} berm_buf;

/** Start an empty buffer; `limit` 0 means BERM_OUTPUT_LIMIT. berm_buf_put may copy bytes of the buffer itself;
 *  every other writer's source (a %s of berm_buf_printf, berm_json_write_string's text) must lie outside it, since
 *  growing the buffer moves its bytes. */
void berm_buf_init(berm_buf *b, size_t limit);
bool berm_buf_ok(const berm_buf *b);
void berm_buf_put(berm_buf *b, const void *data, size_t len);
void berm_buf_puts(berm_buf *b, const char *s);
void berm_buf_putc(berm_buf *b, char c);
/** An unsigned integer in decimal: the fast path for numbering lines (no format string). */
void berm_buf_putu(berm_buf *b, uint64_t value);
void berm_buf_printf(berm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void berm_buf_vprintf(berm_buf *b, const char *fmt, va_list ap);
void berm_buf_free(berm_buf *b);
/** The buffer as the tool's result, or a tool failure naming the overflow. */
berm_result_t berm_buf_finish(berm_buf *b);

/* ---------------------------------------------------------------- freestanding basics */

void *malloc(size_t size);
void free(void *ptr);
void *realloc(void *ptr, size_t size);
void *calloc(size_t count, size_t size);

void *memcpy(void *dst, const void *src, size_t n);
void *memmove(void *dst, const void *src, size_t n);
void *memset(void *dst, int c, size_t n);
int memcmp(const void *a, const void *b, size_t n);
void *memchr(const void *s, int c, size_t n);
size_t strlen(const char *s);
size_t strnlen(const char *s, size_t max);
int strcmp(const char *a, const char *b);
int strncmp(const char *a, const char *b, size_t n);
char *strchr(const char *s, int c);
char *strrchr(const char *s, int c);
char *strstr(const char *haystack, const char *needle);
char *strdup(const char *s);
char *strndup(const char *s, size_t n);
/** Sort n elements of `size` bytes in place, cmp-ascending, in O(n log n) time and no extra memory (a heapsort:
 *  not stable; break ties in cmp when their order matters). */
void qsort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *));
/** The first occurrence of needle in haystack, both with lengths; NULL when absent or needle is empty. Linear
 *  time (the Two-Way search), whatever the two hold. */
const char *berm_memmem(const char *haystack, size_t hlen, const char *needle, size_t nlen);

/** Bounded formatting: %d %i %u %o %x %X %c %s %p %%, %f %e %g (F E G; %a as %e) rounded in double precision, length
 *  modifiers hh h l ll q z j t L, flags '-' '0' '+' ' ' '#' (and glibc's ' and I, which change nothing in this C
 *  locale), a width and a precision of at most 2^31 - 1 (%.*s, %.12s, %.3d, %.2f). A double shows at most 17 significant digits, of
 *  which only the first 15 are exact (the 15th within a unit of C's exact expansion; a tie rounds away from zero):
 *  %.17g does not always read back as the same double, so JSON meant to round-trip doubles needs another writer.
 *  So a double's precision stops at 17 (%.60f of 1.0 shows 17 places, %.20e 16), and %f of a value of 1e17 or more
 *  is written in %e's form.
 *  An integer shows at most 64 digits of precision. Any other conversion (%n, %C, %S, ...) and everything after
 *  it is copied as written: its argument's size is unknown, and reading on would take the wrong arguments. Always
 *  NUL-terminates when cap > 0; returns the length it wanted. */
int vsnprintf(char *buf, size_t cap, const char *fmt, va_list ap);
int snprintf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** Format into fresh heap memory; NULL when out of memory. */
char *berm_aprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------- JSON */

#define BERM_JSON_MAX_DEPTH 64

typedef enum {
    BERM_JSON_NULL,
    BERM_JSON_BOOL,
    BERM_JSON_INT,    /* an integer that fits int64_t */
    BERM_JSON_NUMBER, /* any other number: only its text (str/len) */
    BERM_JSON_STRING,
    BERM_JSON_ARRAY,
    BERM_JSON_OBJECT,
} berm_json_type;

typedef struct berm_json berm_json;
typedef struct berm_json_member berm_json_member;

struct berm_json {
    berm_json_type type;
    bool boolean;          /* BOOL */
    int64_t integer;       /* INT */
    const char *str;       /* STRING: decoded UTF-8, NUL-terminated (may hold \0); INT/NUMBER: the text */
    size_t len;
    size_t count;          /* ARRAY: items; OBJECT: members */
    berm_json *items;
    berm_json_member *members;
};

struct berm_json_member {
    const char *key; /* decoded UTF-8, NUL-terminated */
    size_t key_len;
    berm_json value;
};

typedef struct {
    berm_json *value; /* NULL on error */
    char *error;      /* "… at byte N" on error, else NULL */
} berm_json_parsed;

/** Parse one JSON document (surrounding whitespace allowed). More than BERM_JSON_MAX_DEPTH arrays and objects
 *  nested, invalid UTF-8, lone surrogates, a key repeated in an object, trailing text and running out of memory are
 *  errors. */
berm_json_parsed berm_json_parse(const char *text, size_t len);
void berm_json_free(berm_json *value);
/** The member named `key` of an object, or NULL. */
const berm_json *berm_json_get(const berm_json *object, const char *key);
const char *berm_json_type_name(berm_json_type type);

/** Write `s` as a JSON string literal; invalid UTF-8 becomes U+FFFD so the output is always valid UTF-8. */
void berm_json_write_string(berm_buf *b, const char *s, size_t len);
void berm_json_write_int(berm_buf *b, int64_t value);
/** Write a parsed value back as compact JSON. */
void berm_json_write(berm_buf *b, const berm_json *value);

/** True when the bytes are valid UTF-8 (no overlongs, no surrogates, nothing past U+10FFFF). */
bool berm_utf8_valid(const char *s, size_t len);

/* ---------------------------------------------------------------- tool arguments */

/** A tool's JSON arguments, checked field by field. The first problem is kept in `error` as
 *  "invalid arguments: …", a message a model can act on; later checks then do nothing. */
typedef struct {
    berm_json *object; /* NULL when the arguments are not a JSON object */
    char *error;
} berm_arg_set;

/** Record a problem of the tool's own ("invalid arguments: " is prepended) unless one is already kept. */
void berm_args_problem(berm_arg_set *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Parse berm_args() as a JSON object (empty arguments count as {}) whose keys are all in `known`,
 *  a NULL-terminated list, each given once. */
berm_arg_set berm_args_object(const char *const *known);
/** Each getter leaves *out untouched when the field is absent and not required. A string holding a NUL (\u0000) is
 *  refused: C text stops there, so the tool would act on less than it was given. */
void berm_arg_string(berm_arg_set *a, const char *key, bool required, berm_str *out);
void berm_arg_int(berm_arg_set *a, const char *key, bool required, int64_t min, int64_t max, int64_t *out);
/** An object whose values are all strings (e.g. an environment), as pairs in heap memory; no key twice, no NUL. */
void berm_arg_string_map(berm_arg_set *a, const char *key, bool required, berm_pair **pairs, size_t *count);
/** A string that must be one of `choices` (NULL-terminated). */
void berm_arg_choice(berm_arg_set *a, const char *key, bool required, const char *const *choices,
                     berm_str *out);

/* ---------------------------------------------------------------- capabilities (errors are values) */

/** A capability's reply: `data` (NUL-terminated, heap) or `error` (heap message). */
typedef struct {
    char *data;
    size_t len;
    char *error;
} berm_reply;

void berm_reply_free(berm_reply *reply);
/** The reply as the tool's result: a failure carrying reply->error, or saying that the reply is larger than
 *  `limit` bytes (0: BERM_OUTPUT_LIMIT). */
berm_result_t berm_reply_result(const berm_reply *reply, size_t limit);

/** Encode `fields` as a frame (ABI.md §2), call capability `number`, pull the staged reply or error. */
berm_reply berm_capability(uint64_t number, const berm_str *fields, size_t count);

/** Read a frame: each call yields the next field; false at the end or when malformed (*malformed set). */
typedef struct {
    const char *pos, *end;
    bool malformed;
} berm_frame_reader;

berm_frame_reader berm_frame_reader_init(const char *data, size_t len);
bool berm_frame_next(berm_frame_reader *r, berm_str *field);
/** A decimal integer field (optional leading '-'); false when it is not one or overflows. */
bool berm_parse_int(berm_str text, int64_t *out);

berm_reply berm_fs_read(berm_str path);
berm_reply berm_fs_write(berm_str path, berm_str content);
berm_reply berm_fs_glob(berm_str pattern, berm_str path);
berm_reply berm_fs_grep(berm_str pattern, berm_str path, berm_str include, berm_str mode);
/** The JSON text {"exit_code":N,"stderr":"…","stdout":"…"}. */
berm_reply berm_exec_run(berm_str command, berm_str cwd, const berm_pair *env, size_t env_count);
/** The stored value for `key`; a key the store does not hold is an error reply that berm_kv_missing tells apart. */
berm_reply berm_kv_get(berm_str key);
/** Whether `reply` (from berm_kv_get) is the error for a key the store does not hold, rather than a store that
 *  failed (busy, unreadable), which says nothing of whether the key exists. */
bool berm_kv_missing(const berm_reply *reply);
berm_reply berm_kv_set(berm_str key, berm_str value);
berm_reply berm_kv_delete(berm_str key);
berm_reply berm_schedule_cancel(berm_str id);
berm_reply berm_schedule_at(int64_t when_utc_millis, berm_str id, berm_str payload);
/** The other harness's result text. */
berm_reply berm_call(berm_str harness, berm_str tool, berm_str args);

typedef struct {
    int64_t status;
    berm_str headers; /* "name: value\n" each; points into `raw` */
    berm_str body;
    berm_reply raw;   /* owns the memory; raw.error set on failure */
} berm_http_response;

berm_http_response berm_http_fetch(berm_str method, berm_str url, berm_str body, const berm_pair *headers,
                                   size_t header_count);

typedef struct {
    int64_t utc_millis;
    int64_t local_offset_seconds;
    char *error;
} berm_clock;

berm_clock berm_clock_now(void);

typedef struct {
    berm_str *keys; /* point into raw */
    size_t count;
    berm_reply raw; /* owns the memory; raw.error set on failure */
} berm_kv_keys;

/** Every key starting with `prefix`, sorted; an error when more than BERM_KV_LIST_PAGE do (list them in pages). */
berm_kv_keys berm_kv_list(berm_str prefix);
/** A page of them: the first BERM_KV_LIST_PAGE keys starting with `prefix` that sort after `after` (bytewise; the
 *  empty string: from the first). A full page may have more after its last key: ask again after that key. */
berm_kv_keys berm_kv_list_page(berm_str prefix, berm_str after);
void berm_kv_keys_free(berm_kv_keys *keys);
/** Call visit(key, ctx) on every key starting with `prefix`, in order, listing a page at a time (so any number of
 *  keys). Stops at the first non-NULL visit result and returns it; returns a listing failure as fresh text; NULL
 *  when every key was visited. The key's memory lasts only for its visit. */
char *berm_kv_each(berm_str prefix, char *(*visit)(berm_str key, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* BERM_H */
