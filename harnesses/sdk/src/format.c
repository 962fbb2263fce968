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
    while (count && o->n + 1 < o->cap) put(o, c), count--;
    o->n += count; /* past the buffer only counted: a width of 2^31 is not 2^31 steps */
}

/* A width or precision written in the format, read past its digits; at most INT32_MAX, what one given with '*'
 * can be (found by a review: "%18446744073709551615c" wrapped the count of bytes wanted to 0 and the next byte
 * was written before the buffer). */
static size_t decimal(const char **f) {
    size_t value = 0;
    for (; **f >= '0' && **f <= '9'; (*f)++) {
        value = value * 10 + (size_t)(**f - '0');
        if (value > INT32_MAX) value = INT32_MAX;
    }
    return value;
}

typedef struct {
    bool left, zero, plus, space, alt;
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

/* A number in `base`, at least `min_digits` digits (a precision), after its sign and `prefix` (0x, 0). */
static void emit_number(out_t *o, const spec_t *sp, uint64_t magnitude, bool negative, unsigned base,
                        bool upper, const char *prefix, size_t min_digits) {
    char tmp[96];
    size_t i = sizeof tmp, digits_len = 0;
    const char *digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
    if (min_digits > 64) min_digits = 64;
    while (magnitude || digits_len < min_digits) {
        tmp[--i] = digits[magnitude % base];
        magnitude /= base;
        digits_len++;
    }
    size_t sign_len = 0;
    for (size_t p = strlen(prefix); p; p--) tmp[--i] = prefix[p - 1], sign_len++;
    if (negative || sp->plus || sp->space) tmp[--i] = negative ? '-' : sp->plus ? '+' : ' ', sign_len++;
    emit(o, sp, tmp + i, sizeof tmp - i, sign_len);
}

static const uint64_t POW10[18] = {1ull, 10ull, 100ull, 1000ull, 10000ull, 100000ull, 1000000ull, 10000000ull,
                                   100000000ull, 1000000000ull, 10000000000ull, 100000000000ull,
                                   1000000000000ull, 10000000000000ull, 100000000000000ull,
                                   1000000000000000ull, 10000000000000000ull, 100000000000000000ull};

/* The powers of ten a double holds exactly: the places of %f (at most 20: %g's 17 digits under 0.001), and the
 * scale of significant digits (significant_digits). */
static const double SCALE10[23] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Decimal digits of v, at least `width` of them, at `at`; returns how many. */
static size_t put_decimal(char *at, uint64_t v, size_t width) {
    char tmp[24];
    size_t n = 0;
    do tmp[n++] = (char)('0' + v % 10), v /= 10; while (v);
    while (n < width) tmp[n++] = '0';
    for (size_t k = 0; k < n; k++) at[k] = tmp[n - 1 - k];
    return n;
}

/* |v| as m * 10^e with 1 <= m < 10 (m = 0 for 0). Far from 1 it scales by 10^22 (the largest power of ten a double
 * holds exactly) first: each step rounds, and 300 steps of 10 put 1e-300 at 9.99999999999999e-301 in %.15g. */
static double decimal_exponent(double v, int *e) {
    *e = 0;
    if (v == 0) return 0;
    while (v >= 1e22) v /= 1e22, *e += 22;
    while (v >= 10) v /= 10, (*e)++;
    while (v < 1e-22) v *= 1e22, *e -= 22;
    while (v < 1) v *= 10, (*e)--;
    return v;
}

/* The first p + 1 significant digits of x = m * 10^e (1 <= m < 10), rounded half away from zero: x scaled once by
 * an exact power of ten when there is one, so that a tie rounds as it is (999999.5 to 6 digits is 1000000; m, which
 * took five divisions, is 9.99999499...), else m scaled. */
static uint64_t significant_digits(double x, double m, int e, size_t p) {
    int k = (int)p - e;
    double scaled = k >= 0 && k <= 22 ? x * SCALE10[k] : k < 0 && k >= -22 ? x / SCALE10[-k] : m * (double)POW10[p];
    return (uint64_t)(scaled + 0.5);
}

/* %f %e %g (and F E G) of a double, rounded in double arithmetic: right to the 15-17 significant digits a double
 * holds, which is what a tool's messages need (not libc's exact expansion of every binary value). Precision is
 * capped at 17; %f of a value of 10^17 or more is shown as %e. %a is not supported (formatted as %e). */
static void emit_float(out_t *o, const spec_t *sp, double v, char conv, bool has_precision, size_t precision) {
    char tmp[64];
    size_t n = 0;
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    bool negative = bits >> 63, upper = conv >= 'A' && conv <= 'Z';
    if (negative || sp->plus || sp->space) tmp[n++] = negative ? '-' : sp->plus ? '+' : ' ';
    size_t sign_len = n;
    double x = negative ? -v : v;
    if (x != x || x > 1.7976931348623157e308) { /* NaN, infinity: never zero-padded */
        memcpy(tmp + n, x != x ? (upper ? "NAN" : "nan") : (upper ? "INF" : "inf"), 3);
        spec_t plain = *sp;
        plain.zero = false;
        emit(o, &plain, tmp, n + 3, sign_len);
        return;
    }
    size_t p = has_precision ? precision : 6;
    if (p > 17) p = 17;
    char lower = (char)(conv | 0x20);
    bool strip = false;
    int e;
    double m = decimal_exponent(x, &e);
    if (lower == 'g') {
        if (p == 0) p = 1;
        int rounded = e; /* the exponent once rounded to p significant digits */
        if (m != 0 && significant_digits(x, m, e, p - 1) >= POW10[p]) rounded++;
        strip = !sp->alt;
        if ((int)p > rounded && rounded >= -4) lower = 'f', p = (size_t)((int)p - 1 - rounded);
        else lower = 'e', p -= 1;
        /* in %f style under 0.1, up to 20 places (%.17g of 0.0001): past POW10, which it read beyond */
    }
    if (lower == 'f' && x < 1e17) {
        uint64_t whole = (uint64_t)x, frac = (uint64_t)((x - (double)whole) * SCALE10[p] + 0.5);
        if (p < 18 && frac >= POW10[p]) whole++, frac -= POW10[p]; /* more places only under 0.1: no carry */
        n += put_decimal(tmp + n, whole, 1);
        if (p || sp->alt) tmp[n++] = '.';
        if (p) n += put_decimal(tmp + n, frac, p);
    } else {
        if (p > 16) p = 16; /* 17 significant digits */
        uint64_t digits = significant_digits(x, m, e, p);
        if (m != 0 && digits >= POW10[p + 1]) digits /= 10, e++;
        char lead[24];
        size_t len = put_decimal(lead, digits, p + 1);
        tmp[n++] = lead[0];
        if (p || sp->alt) tmp[n++] = '.';
        memcpy(tmp + n, lead + 1, len - 1);
        n += len - 1;
        tmp[n++] = upper ? 'E' : 'e';
        tmp[n++] = e < 0 ? '-' : '+';
        n += put_decimal(tmp + n, (uint64_t)(e < 0 ? -e : e), 2);
    }
    if (strip) { /* %g: no trailing zeros after the point, nor the point itself (in the mantissa, for %e) */
        size_t exp_at = n;
        for (size_t k = sign_len; k < n; k++)
            if (tmp[k] == 'e' || tmp[k] == 'E') exp_at = k;
        size_t dot = exp_at;
        for (size_t k = sign_len; k < exp_at; k++)
            if (tmp[k] == '.') dot = k;
        if (dot < exp_at) {
            size_t cut = exp_at;
            while (cut > dot + 1 && tmp[cut - 1] == '0') cut--;
            if (cut == dot + 1) cut = dot;
            memmove(tmp + cut, tmp + exp_at, n - exp_at);
            n -= exp_at - cut;
        }
    }
    emit(o, sp, tmp, n, sign_len);
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
            else if (*f == '+') sp.plus = true;
            else if (*f == ' ') sp.space = true;
            else if (*f == '#') sp.alt = true;
            else if (*f != '\'' && *f != 'I') break; /* glibc's grouping and locale digits: none in this C locale */
        }
        if (*f == '*') {
            int w = va_arg(ap, int);
            if (w < 0) sp.left = true, w = w == INT32_MIN ? INT32_MAX : -w; /* -INT_MIN would overflow */
            sp.width = (size_t)w;
            f++;
        } else {
            sp.width = decimal(&f);
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
                precision = decimal(&f);
            }
        }
        /* the argument's size: 8 (l, ll, q, z, j, t: 64 bits here), 2 (h), 1 (hh), else an int; L: a long double,
           or a long long for an integer conversion (as glibc reads %Ld) */
        int size = 4;
        bool long_double = false;
        if (*f == 'z' || *f == 'j' || *f == 't' || *f == 'q') size = 8, f++;
        else if (*f == 'L') long_double = true, size = 8, f++;
        else if (*f == 'h') size = f[1] == 'h' ? (f += 2, 1) : (f++, 2);
        else
            while (*f == 'l') size = 8, f++;
        size_t min_digits = has_precision ? precision : 1; /* an integer's precision: its minimum digits */
        spec_t int_sp = sp, text_sp = sp;
        if (has_precision) int_sp.zero = false; /* and then no zero padding, as in C */
        text_sp.zero = false;                   /* text is padded with spaces, as glibc does */
        switch (*f) {
        case 'd':
        case 'i': {
            int64_t v = size == 8 ? (int64_t)va_arg(ap, long long) : (int64_t)va_arg(ap, int);
            if (size == 2) v = (short)v;
            else if (size == 1) v = (signed char)v;
            uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            emit_number(&o, &int_sp, mag, v < 0, 10, false, "", min_digits);
            break;
        }
        case 'u':
        case 'o':
        case 'x':
        case 'X': {
            uint64_t v = size == 8 ? (uint64_t)va_arg(ap, unsigned long long) : (uint64_t)va_arg(ap, unsigned);
            if (size == 4) v = (uint32_t)v;
            else if (size == 2) v = (uint16_t)v;
            else if (size == 1) v = (uint8_t)v;
            spec_t unsigned_sp = int_sp;
            unsigned_sp.plus = unsigned_sp.space = false;
            const char *prefix = !sp.alt || !v ? "" : *f == 'x' ? "0x" : *f == 'X' ? "0X" : "";
            if (sp.alt && *f == 'o') { /* as many digits as it takes to start with a 0, as C's # does */
                size_t octal = 0;
                for (uint64_t rest = v; rest; rest >>= 3) octal++;
                if (min_digits <= octal) min_digits = octal + 1;
            }
            emit_number(&o, &unsigned_sp, v, false, *f == 'o' ? 8 : *f == 'u' ? 10 : 16, *f == 'X', prefix,
                        min_digits);
            break;
        }
        case 'p': {
            void *p = va_arg(ap, void *);
            if (p) emit_number(&o, &sp, (uint64_t)(uintptr_t)p, false, 16, false, "0x", 1);
            else emit(&o, &text_sp, "(nil)", 5, 0); /* as glibc */
            break;
        }
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
        case 'a':
        case 'A': {
            double v = long_double ? (double)va_arg(ap, long double) : va_arg(ap, double);
            emit_float(&o, &sp, v, *f == 'a' ? 'e' : *f == 'A' ? 'E' : *f, has_precision, precision);
            break;
        }
        case 'c': {
            char c = (char)va_arg(ap, int);
            emit(&o, &text_sp, &c, 1, 0);
            break;
        }
        case 's': {
            const char *s = va_arg(ap, const char *);
            if (!s) s = has_precision && precision < 6 ? "" : "(null)"; /* as glibc: never a cut "(nu" */
            emit(&o, &text_sp, s, has_precision ? strnlen(s, precision) : strlen(s), 0);
            break;
        }
        case '%':
            put(&o, '%');
            break;
        default: /* not a conversion we know (%n, %C, %S, %b, ...): its argument's size is unknown, so every later
                    conversion would read the wrong argument; the rest of the format is copied as written */
            put_n(&o, start, strlen(start));
            goto done;
        }
    }
done:
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
