/* mem* and str*: clang emits calls to memcpy/memset/memmove/memcmp on its own, so a guest must have them.
 * Copies and scans move 8-byte words: misaligned plain loads and stores are allowed in guest memory (and cost
 * nothing extra once translated), so no alignment dance is needed. */
#include "berm.h"

typedef uint64_t __attribute__((may_alias, aligned(1))) word;

#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull

void *memcpy(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (; n >= 8; n -= 8, d += 8, s += 8) *(word *)d = *(const word *)s;
    for (; n; n--) *d++ = *s++;
    return dst;
}

void *memmove(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    if (d == s || n == 0) return dst;
    if (d < s || d >= s + n) return memcpy(dst, src, n);
    d += n;
    s += n;
    for (; n >= 8; n -= 8) {
        d -= 8;
        s -= 8;
        *(word *)d = *(const word *)s;
    }
    for (; n; n--) *--d = *--s;
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    uint64_t pattern = (unsigned char)c * ONES;
    for (; n >= 8; n -= 8, d += 8) *(word *)d = pattern;
    for (; n; n--) *d++ = (unsigned char)c;
    return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = a, *y = b;
    for (; n; n--, x++, y++)
        if (*x != *y) return *x < *y ? -1 : 1;
    return 0;
}

void *memchr(const void *s, int c, size_t n) {
    const unsigned char *p = s;
    uint64_t pattern = (unsigned char)c * ONES;
    for (; n >= 8; n -= 8, p += 8) { /* stop at the first word holding a byte equal to c */
        uint64_t w = *(const word *)p ^ pattern;
        if ((w - ONES) & ~w & HIGHS) break;
    }
    for (; n; n--, p++)
        if (*p == (unsigned char)c) return (void *)p;
    return NULL;
}

size_t strlen(const char *s) {
    const char *p = s;
    while (*p) p++;
    return (size_t)(p - s);
}

size_t strnlen(const char *s, size_t max) {
    size_t n = 0;
    while (n < max && s[n]) n++;
    return n;
}

int strcmp(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return (unsigned char)*a - (unsigned char)*b;
}

int strncmp(const char *a, const char *b, size_t n) {
    for (; n; n--, a++, b++) {
        if (*a != *b) return (unsigned char)*a - (unsigned char)*b;
        if (!*a) return 0;
    }
    return 0;
}

char *strchr(const char *s, int c) {
    for (;; s++) {
        if (*s == (char)c) return (char *)s;
        if (!*s) return NULL;
    }
}

char *strrchr(const char *s, int c) {
    const char *last = NULL;
    for (;; s++) {
        if (*s == (char)c) last = s;
        if (!*s) return (char *)last;
    }
}

const char *berm_memmem(const char *haystack, size_t hlen, const char *needle, size_t nlen) {
    if (nlen == 0 || nlen > hlen) return NULL;
    const char *last = haystack + (hlen - nlen);
    for (const char *p = haystack; p <= last; p++) {
        p = memchr(p, needle[0], (size_t)(last - p) + 1);
        if (!p) return NULL;
        if (memcmp(p, needle, nlen) == 0) return p;
    }
    return NULL;
}

char *strstr(const char *haystack, const char *needle) {
    if (!*needle) return (char *)haystack;
    return (char *)berm_memmem(haystack, strlen(haystack), needle, strlen(needle));
}

char *strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *out = malloc(len + 1);
    if (!out) return NULL;
    memcpy(out, s, len);
    out[len] = 0;
    return out;
}

char *strdup(const char *s) { return strndup(s, (size_t)-1); }
