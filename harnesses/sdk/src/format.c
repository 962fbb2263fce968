/* A bounded snprintf: the conversions tool code needs (see berm.h), never writing past `cap`. */
#include "berm.h"

typedef struct {
    char *buf;
    size_t cap, n; /* n counts every byte wanted, written or not */
} out_t;

static void put(out_t *o, char c) {
    if (o->n + 1 < o->cap) o->buf[o->n] = c;
    o->n++;
}

static void put_n(out_t *o, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) put(o, s[i]);
}

static void pad(out_t *o, char c, size_t count) {
    while (count--) put(o, c);
}

typedef struct {
    bool left, zero;
    size_t width;
} spec_t;

/* `text` padded to the spec's width; zero padding goes after the sign (`sign_len` leading bytes). */
static void emit(out_t *o, const spec_t *sp, const char *text, size_t len, size_t sign_len) {
    size_t fill = sp->width > len ? sp->width - len : 0;
    if (sp->left) {
        put_n(o, text, len);
        pad(o, ' ', fill);
    } else if (sp->zero) {
        put_n(o, text, sign_len);
        pad(o, '0', fill);
        put_n(o, text + sign_len, len - sign_len);
    } else {
        pad(o, ' ', fill);
        put_n(o, text, len);
    }
}

static void emit_number(out_t *o, const spec_t *sp, uint64_t magnitude, bool negative, unsigned base,
                        bool upper, const char *prefix) {
    char tmp[32];
    size_t i = sizeof tmp;
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    do {
        tmp[--i] = digits[magnitude % base];
        magnitude /= base;
    } while (magnitude);
    size_t sign_len = 0;
    for (size_t p = strlen(prefix); p; p--) tmp[--i] = prefix[p - 1], sign_len++;
    if (negative) tmp[--i] = '-', sign_len++;
    emit(o, sp, tmp + i, sizeof tmp - i, sign_len);
}

int vsnprintf(char *buf, size_t cap, const char *fmt, va_list ap) {
    out_t o = {buf, cap, 0};
    for (const char *f = fmt; *f; f++) {
        if (*f != '%') {
            put(&o, *f);
            continue;
        }
        const char *start = f++;
        spec_t sp = {0};
        for (;; f++) {
            if (*f == '-') sp.left = true;
            else if (*f == '0') sp.zero = true;
            else break;
        }
        if (*f == '*') {
            int w = va_arg(ap, int);
            if (w < 0) sp.left = true, w = -w;
            sp.width = (size_t)w;
            f++;
        } else {
            while (*f >= '0' && *f <= '9') sp.width = sp.width * 10 + (size_t)(*f++ - '0');
        }
        bool has_precision = false;
        size_t precision = 0;
        if (*f == '.') {
            has_precision = true;
            f++;
            if (*f == '*') {
                int p = va_arg(ap, int);
                precision = p < 0 ? 0 : (size_t)p;
                has_precision = p >= 0;
                f++;
            } else {
                while (*f >= '0' && *f <= '9') precision = precision * 10 + (size_t)(*f++ - '0');
            }
        }
        int longs = 0;
        bool size_t_arg = false;
        if (*f == 'z') size_t_arg = true, f++;
        else
            while (*f == 'l' && longs < 2) longs++, f++;
        switch (*f) {
        case 'd':
        case 'i': {
            int64_t v = size_t_arg ? (int64_t)va_arg(ap, ptrdiff_t)
                        : longs == 2 ? (int64_t)va_arg(ap, long long)
                        : longs == 1 ? (int64_t)va_arg(ap, long)
                                     : (int64_t)va_arg(ap, int);
            uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            emit_number(&o, &sp, mag, v < 0, 10, false, "");
            break;
        }
        case 'u':
        case 'x':
        case 'X': {
            uint64_t v = size_t_arg ? (uint64_t)va_arg(ap, size_t)
                         : longs == 2 ? (uint64_t)va_arg(ap, unsigned long long)
                         : longs == 1 ? (uint64_t)va_arg(ap, unsigned long)
                                      : (uint64_t)va_arg(ap, unsigned);
            emit_number(&o, &sp, v, false, *f == 'u' ? 10 : 16, *f == 'X', "");
            break;
        }
        case 'p':
            emit_number(&o, &sp, (uint64_t)(uintptr_t)va_arg(ap, void *), false, 16, false, "0x");
            break;
        case 'c': {
            char c = (char)va_arg(ap, int);
            emit(&o, &sp, &c, 1, 0);
            break;
        }
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            emit(&o, &sp, s, has_precision ? strnlen(s, precision) : strlen(s), 0);
            break;
        }
        case '%':
            put(&o, '%');
            break;
        default: /* not a conversion we know: copy the text as written */
            if (!*f) f--;
            put_n(&o, start, (size_t)(f - start) + 1);
            break;
        }
    }
    if (cap) buf[o.n < cap ? o.n : cap - 1] = 0;
    return o.n > 0x7fffffff ? 0x7fffffff : (int)o.n;
}

int snprintf(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return n;
}

char *berm_aprintf(const char *fmt, ...) {
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *out = malloc((size_t)n + 1);
    if (out) vsnprintf(out, (size_t)n + 1, fmt, again);
    va_end(again);
    return out;
}
