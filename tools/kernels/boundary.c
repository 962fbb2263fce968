/* A minimal harness for Berm's boundary figures, with raw ecalls (no SDK), so that it measures the host and
 * nothing else:
 *   - the tool `ping` pulls its arguments (berm.args.read) and returns a small JSON result;
 *   - bench_ecall_loop(n, number) makes n host calls `number` (the benchmark passes berm.args.len);
 *   - bench_capability_loop(n, number) makes n round trips to the capability `number` and pulls each staged
 *     reply with berm.result.read, as a harness does.
 * Host-call numbers are derived from their names with FNV-1a 64 (ABI.md §1), never written down. */
#include <stdint.h>

#define MANIFEST "{\"abi_version\":0,\"tools\":[{\"name\":\"ping\",\"description\":\"pull the arguments, " \
                 "return their length\",\"parameters\":{\"type\":\"object\"}}],\"usage\":\"\"}"

/* Exactly the JSON text, no terminating NUL. */
__attribute__((section(".berm.abi"), used)) static const char berm_manifest[sizeof(MANIFEST) - 1] = MANIFEST;

typedef struct {
    uint64_t ptr;
    uint64_t len;
} berm_result_t;

static inline uint64_t fnv1a64(const char *name) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *name; name++)
        h = (h ^ (uint8_t)*name) * 0x100000001b3ULL;
    return h;
}

static inline uint64_t host_call(uint64_t number, uint64_t arg0, uint64_t arg1) {
    register uint64_t a0 __asm__("a0") = arg0;
    register uint64_t a1 __asm__("a1") = arg1;
    register uint64_t a7 __asm__("a7") = number;
    __asm__ volatile("ecall" : "+r"(a0) : "r"(a1), "r"(a7) : "memory");
    return a0;
}

static uint8_t args[4096];
static char out[32];
static uint8_t request[16] = {8, 0, 0, 0, 'b', 'e', 'n', 'c', 'h', 'm', 'r', 'k'};
static uint8_t reply[64];

berm_result_t berm_tool_ping(void) {
    uint64_t len = host_call(fnv1a64("berm.args.read"), (uint64_t)(uintptr_t)args, sizeof args);
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

uint64_t bench_ecall_loop(uint64_t n, uint64_t number) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++)
        sum += host_call(number, (uint64_t)(uintptr_t)request, 12);
    return sum;
}

uint64_t bench_capability_loop(uint64_t n, uint64_t number) {
    uint64_t read = fnv1a64("berm.result.read"), sum = 0;
    for (uint64_t i = 0; i < n; i++) {
        sum += host_call(number, (uint64_t)(uintptr_t)request, 12);
        sum += host_call(read, (uint64_t)(uintptr_t)reply, sizeof reply);
    }
    return sum;
}

void _start(void) {
    static volatile uint64_t sink[4];
    sink[0] = (uint64_t)(uintptr_t)berm_manifest;
    sink[1] = (uint64_t)(uintptr_t)berm_tool_ping;
    sink[2] = (uint64_t)(uintptr_t)bench_ecall_loop;
    sink[3] = (uint64_t)(uintptr_t)bench_capability_loop;
}
