/* shim.c: the host side of berm_host_call for native builds of the SDK ("the SDK also builds for the host").
 *
 * Core calls are served here from static state; berm.log and capabilities go to a callback the embedder sets
 * (berm_sdk/native.py sets a Python one). A call nobody serves, and berm_panic, end the invocation with a
 * recorded panic instead of a plausible zero. Each invocation starts with a fresh heap, as a guest's does;
 * the harness's own static data is not reset (a guest's would be). */
#include "berm.h"

void berm__heap_reset(void); /* src/alloc.c */

#define SHIM_HEAP_SIZE (32u << 20)
#define SHIM_FAILURE_CAP 65536u

/* Serves berm.log and capabilities: returns false when it does not serve `number`. A capability's reply is
 * staged with berm_shim_stage before returning. */
typedef bool (*berm_shim_host_fn)(uint64_t number, const char *request, uint64_t len);

static _Alignas(16) unsigned char heap[SHIM_HEAP_SIZE];
static const char *args;
static size_t args_len;
static char failure[SHIM_FAILURE_CAP];
static size_t failure_len, failure_asked; /* kept, and as long as the tool's text was */
static bool failed;
static const char *staged;
static uint64_t staged_len, staged_status;
static char panic_text[512];
static void *panic_jump[5];
static berm_shim_host_fn host;

void berm_shim_set_host(berm_shim_host_fn fn) { host = fn; }

/* The reply of the capability being served; `data` must stay valid until the next capability call. */
void berm_shim_stage(const char *data, uint64_t len, bool is_error) {
    staged = data;
    staged_len = len;
    staged_status = len | (is_error ? BERM_ERROR_BIT : 0);
}

/* The failure text's first SHIM_FAILURE_CAP bytes (the host's MAX_FAIL_TEXT): `*len` of them, of `*asked`. */
const char *berm_shim_failure(size_t *len, size_t *asked) {
    *len = failure_len;
    *asked = failure_asked;
    return failure;
}

const char *berm_shim_panic_text(void) { return panic_text; }

static void copy_out(uint64_t dst, const char *src, uint64_t have, uint64_t cap) {
    memcpy((void *)(uintptr_t)dst, src, have < cap ? have : cap);
}

uint64_t berm_host_call(uint64_t number, uint64_t a0, uint64_t a1) {
    switch (number) {
    case BERM_CALL_ARGS_LEN: return args_len;
    case BERM_CALL_ARGS_READ: copy_out(a0, args, args_len, a1); return args_len;
    case BERM_CALL_RESULT_READ: copy_out(a0, staged, staged_len, a1); return staged_len;
    case BERM_CALL_HEAP_START: return (uint64_t)(uintptr_t)heap;
    case BERM_CALL_HEAP_SIZE: return SHIM_HEAP_SIZE;
    case BERM_CALL_FAIL:
        failure_asked = (size_t)a1;
        failure_len = a1 < SHIM_FAILURE_CAP ? (size_t)a1 : SHIM_FAILURE_CAP;
        memcpy(failure, (const void *)(uintptr_t)a0, failure_len);
        failed = true;
        return 0;
    default:
        if (host && host(number, (const char *)(uintptr_t)a0, a1)) return number == BERM_CALL_LOG ? 0 : staged_status;
        if (number == BERM_CALL_LOG) return 0;
        snprintf(panic_text, sizeof panic_text, "no host function for call %llu", (unsigned long long)number);
        __builtin_longjmp(panic_jump, 1);
    }
}

void berm_panic(const char *why) {
    snprintf(panic_text, sizeof panic_text, "%s", why);
    __builtin_longjmp(panic_jump, 1);
}

/* Run one tool on `request_args`: 0 = returned (*out set), 1 = failed (berm_shim_failure), 2 = panicked
 * (berm_shim_panic_text). */
int berm_shim_invoke(berm_result_t (*tool)(void), const char *request_args, size_t len, berm_result_t *out) {
    args = request_args;
    args_len = len;
    failed = false;
    failure_len = 0;
    staged = NULL;
    staged_len = staged_status = 0;
    panic_text[0] = 0;
    berm__heap_reset();
    if (__builtin_setjmp(panic_jump)) return 2;
    *out = tool();
    return failed ? 1 : 0;
}
