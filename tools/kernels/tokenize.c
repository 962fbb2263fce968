/* A tokenizer: generate 2 KiB of program-like text (identifiers, numbers, strings, operators, comments,
 * whitespace), then scan it n times into tokens, counting them by kind and hashing identifiers (FNV-1a).
 * One unit of work = one scan of 2 KiB. */
#include "kernel.h"

#define TEXT_LEN 2048

enum { C_OTHER, C_SPACE, C_ALPHA, C_DIGIT, C_QUOTE, C_SLASH, C_PUNCT };

static char tok_text[TEXT_LEN + 1];
static uint8_t tok_class[256];

static const char tok_punct[] = "+-*=<>(){}[];,.!&|";

static void tok_setup(void) {
    for (int c = 0; c < 256; c++) {
        uint8_t k = C_OTHER;
        if (c == ' ' || c == '\n' || c == '\t') k = C_SPACE;
        else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') k = C_ALPHA;
        else if (c >= '0' && c <= '9') k = C_DIGIT;
        else if (c == '"') k = C_QUOTE;
        else if (c == '/') k = C_SLASH;
        tok_class[c] = k;
    }
    for (const char *p = tok_punct; *p; p++)
        tok_class[(uint8_t)*p] = C_PUNCT;

    uint64_t seed = 0x70c0ffeeULL;
    int i = 0;
    while (i < TEXT_LEN - 24) {
        uint64_t r = kernel_rng(&seed);
        int len = 1 + (int)((r >> 8) % 8);
        switch (r % 8) {
        case 0: case 1: case 2:
            for (int k = 0; k < len; k++) tok_text[i++] = (char)('a' + (r >> (16 + 3 * k)) % 26);
            break;
        case 3:
            for (int k = 0; k < len; k++) tok_text[i++] = (char)('0' + (r >> (16 + 4 * k)) % 10);
            break;
        case 4:
            tok_text[i++] = '"';
            for (int k = 0; k < len; k++) tok_text[i++] = (char)('a' + (r >> (16 + 3 * k)) % 26);
            tok_text[i++] = '"';
            break;
        case 5:
            tok_text[i++] = tok_punct[(r >> 16) % (sizeof tok_punct - 1)];
            break;
        case 6:
            tok_text[i++] = '/';
            tok_text[i++] = '/';
            for (int k = 0; k < len; k++) tok_text[i++] = 'x';
            tok_text[i++] = '\n';
            break;
        default:
            tok_text[i++] = (r >> 16) & 1 ? '\n' : ' ';
            break;
        }
        tok_text[i++] = ' ';
    }
    while (i < TEXT_LEN) tok_text[i++] = ' ';
    tok_text[TEXT_LEN] = 0;
}

/* Scan the text once; returns a checksum of token kinds, lengths and identifier hashes. */
static uint64_t tok_scan(void) {
    uint64_t counts[8] = {0};
    uint64_t hash = 0;
    const char *p = tok_text;
    while (*p) {
        const char *start = p;
        uint8_t kind = tok_class[(uint8_t)*p];
        switch (kind) {
        case C_SPACE:
            p++;
            continue;
        case C_ALPHA: {
            uint64_t h = 0xcbf29ce484222325ULL;
            while (tok_class[(uint8_t)*p] == C_ALPHA || tok_class[(uint8_t)*p] == C_DIGIT) {
                h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
                p++;
            }
            hash += h;
            break;
        }
        case C_DIGIT: {
            uint64_t v = 0;
            while (tok_class[(uint8_t)*p] == C_DIGIT) v = v * 10 + (uint64_t)(*p++ - '0');
            hash ^= v;
            break;
        }
        case C_QUOTE:
            p++;
            while (*p && *p != '"') p++;
            if (*p) p++;
            break;
        case C_SLASH:
            if (p[1] == '/') {
                while (*p && *p != '\n') p++;
                kind = C_OTHER; /* a comment counts as its own kind */
            } else {
                p++;
            }
            break;
        default:
            p++;
            break;
        }
        counts[kind]++;
        hash = hash * 0x9e3779b97f4a7c15ULL + (uint64_t)(p - start);
    }
    uint64_t sum = hash;
    for (int k = 0; k < 8; k++) sum = sum * 1000003 + counts[k];
    return sum;
}

uint64_t kernel_tokenize(uint64_t n) {
    tok_setup();
    uint64_t sum = 0;
    for (uint64_t r = 0; r < n; r++)
        sum = sum * 7 + tok_scan() + r;
    return sum;
}
