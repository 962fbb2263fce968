/* A minimal harness for Berm's boundary figures: raw host calls through the SDK header's inline ecall (no SDK
 * runtime, no allocator), so that it measures the host and nothing else:
 *   - the tool `ping` pulls its arguments (berm.args.read) and returns a small JSON result;
 *   - bench_args_read_loop(n) makes n core host calls berm.args.read of 8 bytes, which the translator sends to the
 *     core's dispatch (ctx->ecall2); bench_args_len_loop(n) makes n berm.args.len, which it inlines into a read of a
 *     field of ctx; bench_no_call_loop(n) is the same loop without the ecall, the baseline both are net of;
 *   - bench_capability_loop(n, number) makes n round trips to the capability `number` and pulls each staged
 *     reply with berm.result.read, as a harness does.
 * Host-call numbers come from berm_calls.h, generated from berm_abi/names.py. */
#include "berm.h"

#define MANIFEST "{\"abi_version\":0,\"tools\":[{\"name\":\"ping\",\"description\":\"pull the arguments, " \
                 "return their length\",\"parameters\":{\"type\":\"object\"}}],\"usage\":\"\"}"

/* Exactly the JSON text, no terminating NUL. */
__attribute__((section(".berm.abi"), used)) static const char berm_manifest[sizeof(MANIFEST) - 1] = MANIFEST;

static uint8_t args[4096];
static char out[32];
static uint8_t request[16] = {8, 0, 0, 0, 'b', 'e', 'n', 'c', 'h', 'm', 'r', 'k'};
static uint8_t reply[64];

berm_result_t berm_tool_ping(void) {
    uint64_t len = berm_host_call(BERM_CALL_ARGS_READ, (uint64_t)(uintptr_t)args, sizeof args);
    char digits[20];
    int k = 0, d = 0;
    do {
        digits[d++] = (char)('0' + len % 10);
        len /= 10;
    } while (len);
    const char *head = "{\"len\":";
    while (*head) out[k++] = *head++;
    while (d) out[k++] = digits[--d];
    out[k++] = '}';
    return (berm_result_t){(uint64_t)(uintptr_t)out, (uint64_t)k};
}

/* berm_host_call without its ecall: the number and arguments in registers, the first read back, so that a loop of
 * these is a loop of host calls less the calls. */
static inline uint64_t no_host_call(uint64_t number, uint64_t arg0, uint64_t arg1) {
    __asm__ volatile("" : "+r"(arg0) : "r"(number), "r"(arg1) : "memory");
    return arg0;
}

/* n calls `call(number, args, 8)`, summed. The number is a constant, as in a harness (the SDK's calls name theirs),
 * so the translator knows it and treats each call as it would there. */
#define CALL_LOOP(name, call, number)                                   \
    uint64_t name(uint64_t n) {                                         \
        uint64_t sum = 0;                                               \
        for (uint64_t i = 0; i < n; i++)                                \
            sum += call(number, (uint64_t)(uintptr_t)args, 8);          \
        return sum;                                                     \
    }

CALL_LOOP(bench_args_read_loop, berm_host_call, BERM_CALL_ARGS_READ)
CALL_LOOP(bench_args_len_loop, berm_host_call, BERM_CALL_ARGS_LEN)
CALL_LOOP(bench_no_call_loop, no_host_call, BERM_CALL_ARGS_READ)

uint64_t bench_capability_loop(uint64_t n, uint64_t number) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        sum += berm_host_call(number, (uint64_t)(uintptr_t)request, 12);
        sum += berm_host_call(BERM_CALL_RESULT_READ, (uint64_t)(uintptr_t)reply, sizeof reply);
    }
    return sum;
}

void _start(void) {
    static volatile uint64_t sink[6];
    sink[0] = (uint64_t)(uintptr_t)berm_manifest;
    sink[1] = (uint64_t)(uintptr_t)berm_tool_ping;
    sink[2] = (uint64_t)(uintptr_t)bench_args_read_loop;
    sink[3] = (uint64_t)(uintptr_t)bench_args_len_loop;
    sink[4] = (uint64_t)(uintptr_t)bench_no_call_loop;
    sink[5] = (uint64_t)(uintptr_t)bench_capability_loop;
}
