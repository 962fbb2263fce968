/* Tool arguments as a checked JSON object: every problem becomes "invalid arguments: …", never a trap. */
#include "berm.h"

void berm_args_problem(berm_arg_set *a, const char *fmt, ...) {
    if (a->error) return;
    berm_buf b;
    berm_buf_init(&b, 0);
    berm_buf_puts(&b, "invalid arguments: ");
    va_list ap;
    va_start(ap, fmt);
    berm_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    if (!berm_buf_ok(&b)) berm_panic("out of memory describing invalid arguments");
    a->error = b.data;
}


/* "a, b, c" built in `b` (freed by the caller). */
static const char *joined(berm_buf *b, const char *const *names) {
    berm_buf_init(b, 0);
    for (const char *const *n = names; *n; n++) berm_buf_printf(b, "%s%s", n == names ? "" : ", ", *n);
    return b->data ? b->data : "";
}

/* The most bytes of a caller's text a message shows, and room for them written out (a byte at most 6: \u00XX). */
#define SHOWN_CAP 64
#define SHOWN_ROOM (SHOWN_CAP * 6 + 1)

/* The `len` bytes at `s` as a message shows them, written into `out` (SHOWN_ROOM bytes): at most `cap` (up to
 * SHOWN_CAP) of them, never cutting a UTF-8 character (the host showed a cut one as U+FFFD: found by a review), and
 * each control character, NUL among them, as JSON writes it (\u0000): printed as C text, a NUL cut the message
 * there, and "'c' must be one of a, bb, not 'a'" refused an "a\u0000" (a review). */
static const char *shown(char *out, const char *s, size_t len, size_t cap) {
    size_t n = len <= cap ? len : cap;
    if (n < len)
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--; /* s[n], the first byte left out, continues one */
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) w += (size_t)snprintf(out + w, SHOWN_ROOM - w, "\\u%04x", c);
        else out[w++] = (char)c;
    }
    out[w] = '\0';
    return out;
}

/* What a value is, as a message names it: a number with neither fraction nor exponent is an integer, however
 * large (the Rust SDK says so; this one said "number" of 12345678901234567890: a review). */
static const char *kind_of(const berm_json *v) {
    if (v->type == BERM_JSON_NUMBER && !memchr(v->str, '.', v->len) && !memchr(v->str, 'e', v->len) &&
        !memchr(v->str, 'E', v->len))
        return "integer";
    return berm_json_type_name(v->type);
}

/* Whether the `len` bytes at `s` hold a NUL: refused in a string argument, which C code reads only up to it (a
 * review: reminders cancelled "r1\u0000junk" as r1 in one step and as the whole id in the next). */
static bool holds_nul(const char *s, size_t len) { return memchr(s, 0, len) != NULL; }

berm_arg_set berm_args_object(const char *const *known) {
    berm_arg_set a = {0};
    berm_str raw = berm_args();
    if (!raw.ptr) {
        berm_args_problem(&a, "out of memory reading %zu bytes of arguments", berm_args_len());
        return a;
    }
    const char *empty = "{}";
    berm_json_parsed p = raw.len ? berm_json_parse(raw.ptr, raw.len) : berm_json_parse(empty, 2);
    free((void *)raw.ptr);
    if (p.error) {
        if (strncmp(p.error, "out of memory", 13) == 0) /* the parser's: no fault of the arguments */
            berm_args_problem(&a, "out of memory reading %zu bytes of arguments", raw.len);
        else
            berm_args_problem(&a, "not JSON: %s", p.error);
        free(p.error);
        return a;
    }
    if (p.value->type != BERM_JSON_OBJECT) {
        berm_args_problem(&a, "expected a JSON object, not %s", berm_json_type_name(p.value->type));
        berm_json_free(p.value);
        return a;
    }
    a.object = p.value;
    char text[SHOWN_ROOM];
    for (size_t i = 0; i < a.object->count && !a.error; i++) {
        const berm_json_member *m = &a.object->members[i];
        bool ok = false;
        for (const char *const *k = known; *k && !ok; k++) ok = m->key_len == strlen(*k) && memcmp(m->key, *k, m->key_len) == 0;
        if (ok) continue;
        berm_buf names;
        berm_args_problem(&a, "unknown field '%s' (expected: %s)", shown(text, m->key, m->key_len, SHOWN_CAP),
                joined(&names, known));
        berm_buf_free(&names);
    }
    return a;
}

/* The field, or NULL when absent (a problem when required) or when an earlier problem stopped the checks. */
static const berm_json *field(berm_arg_set *a, const char *key, bool required) {
    if (a->error || !a->object) return NULL;
    const berm_json *v = berm_json_get(a->object, key);
    if (!v && required) berm_args_problem(a, "missing required field '%s'", key);
    return v;
}

static bool expect(berm_arg_set *a, const berm_json *v, const char *key, berm_json_type type, const char *what) {
    if (v->type == type) return true;
    berm_args_problem(a, "'%s' must be %s, not %s", key, what, kind_of(v));
    return false;
}

void berm_arg_string(berm_arg_set *a, const char *key, bool required, berm_str *out) {
    const berm_json *v = field(a, key, required);
    if (!v || !expect(a, v, key, BERM_JSON_STRING, "a string")) return;
    if (holds_nul(v->str, v->len)) {
        berm_args_problem(a, "'%s' must not hold a NUL (\\u0000)", key);
        return;
    }
    *out = (berm_str){v->str, v->len};
}

/* The value of a JSON number's text when it is a whole number that fits an int64 (1.0, 1e2, -2.50e1: JSON Schema's
 * "integer" takes them), exactly, from its digits. */
static bool whole_number(const char *t, size_t len, int64_t *out) {
    const char *p = t, *end = t + len;
    bool negative = p < end && *p == '-';
    p += negative;
    char digits[24];
    size_t n = 0, zeros = 0; /* zeros: since the last digit that is not one, kept only if another follows */
    long scale = 0;          /* value = digits * 10^(scale + zeros) */
    bool seen_point = false;
    for (; p < end && ((*p >= '0' && *p <= '9') || (*p == '.' && !seen_point)); p++) {
        if (*p == '.') {
            seen_point = true;
            continue;
        }
        scale -= seen_point;
        if (*p == '0') { /* leading zeros add nothing; others wait (1.000…0 is a whole number of any length) */
            zeros += n > 0;
            continue;
        }
        if (n + zeros >= sizeof digits) return false; /* more significant digits than an int64 has */
        for (; zeros; zeros--) digits[n++] = '0';
        digits[n++] = *p;
    }
    scale += (long)zeros;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        bool down = p < end && *p == '-';
        p += p < end && (*p == '-' || *p == '+');
        long e = 0; /* past 10^12, more than any text has digits, it stays there: as good as infinite */
        for (; p < end && *p >= '0' && *p <= '9'; p++)
            if (e <= 1000000000000L) e = e * 10 + (*p - '0');
        scale += down ? -e : e;
    }
    if (n == 0) return *out = 0, true;
    if (scale < 0 || (long)n + scale > 19) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n + (size_t)scale; i++) {
        unsigned d = i < n ? (unsigned)(digits[i] - '0') : 0;
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    if (v > (uint64_t)INT64_MAX + negative) return false;
    *out = negative ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

void berm_arg_int(berm_arg_set *a, const char *key, bool required, int64_t min, int64_t max, int64_t *out) {
    const berm_json *v = field(a, key, required);
    if (!v) return;
    int64_t value = v->integer;
    if (v->type == BERM_JSON_NUMBER && !whole_number(v->str, v->len, &value)) {
        berm_args_problem(a, "'%s' must be an integer between %lld and %lld, not %.40s", key, (long long)min, (long long)max,
                v->str);
        return;
    }
    if (v->type != BERM_JSON_NUMBER && !expect(a, v, key, BERM_JSON_INT, "an integer")) return;
    if (value < min || value > max) {
        berm_args_problem(a, "'%s' must be between %lld and %lld, not %lld", key, (long long)min, (long long)max,
                (long long)value);
        return;
    }
    *out = value;
}

void berm_arg_string_map(berm_arg_set *a, const char *key, bool required, berm_pair **pairs, size_t *count) {
    const berm_json *v = field(a, key, required);
    if (!v || !expect(a, v, key, BERM_JSON_OBJECT, "an object of strings")) return;
    berm_pair *out = malloc((v->count ? v->count : 1) * sizeof *out);
    if (!out) {
        berm_args_problem(a, "out of memory for %zu entries of '%s'", v->count, key);
        return;
    }
    char text[SHOWN_ROOM];
    for (size_t i = 0; i < v->count; i++) {
        const berm_json_member *m = &v->members[i];
        if (m->value.type != BERM_JSON_STRING) {
            berm_args_problem(a, "'%s.%s' must be a string, not %s", key, shown(text, m->key, m->key_len, SHOWN_CAP),
                    kind_of(&m->value));
            free(out);
            return;
        }
        if (holds_nul(m->key, m->key_len) || holds_nul(m->value.str, m->value.len)) {
            berm_args_problem(a, "'%s.%s' must not hold a NUL (\\u0000) in its key or value", key,
                    shown(text, m->key, m->key_len, SHOWN_CAP));
            free(out);
            return;
        }
        out[i] = (berm_pair){{m->key, m->key_len}, {m->value.str, m->value.len}};
    }
    *pairs = out;
    *count = v->count;
}

void berm_arg_choice(berm_arg_set *a, const char *key, bool required, const char *const *choices,
                     berm_str *out) {
    berm_str value = {0};
    berm_arg_string(a, key, required, &value);
    if (a->error || !value.ptr) return;
    for (const char *const *c = choices; *c; c++) {
        if (berm_str_eq(value, *c)) {
            *out = value;
            return;
        }
    }
    berm_buf names;
    char text[SHOWN_ROOM];
    berm_args_problem(a, "'%s' must be one of %s, not '%s'", key, joined(&names, choices),
            shown(text, value.ptr, value.len, 40));
    berm_buf_free(&names);
}
