/* A small JSON reader (into a tree of berm_json nodes on the heap) and writer (into a berm_buf).
 * Strings are validated UTF-8; \uXXXX escapes, surrogate pairs included, decode to UTF-8. */
#include "berm.h"

/* ---------------------------------------------------------------- UTF-8 */

/* The length of the valid UTF-8 sequence at s (1–4), or 0 when the bytes there are not valid UTF-8
 * (truncated, overlong, a surrogate, or past U+10FFFF). */
static size_t utf8_sequence(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return len;
}

bool berm_utf8_valid(const char *s, size_t len) {
    typedef uint64_t __attribute__((may_alias, aligned(1))) word;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        if (len - i >= 8 && !(*(const word *)(p + i) & 0x8080808080808080ull)) { /* 8 ASCII bytes at once */
            i += 8;
            continue;
        }
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        size_t seq = utf8_sequence(p + i, len - i);
        if (!seq) return false;
        i += seq;
    }
    return true;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xe0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ---------------------------------------------------------------- reader */

typedef struct {
    const char *s;
    size_t len, pos;
    const char *what; /* the first error, at byte `at`; formatted once the partial tree is freed */
    size_t at;
    char repeated[64]; /* the error naming a repeated key, which `what` then points to */
} parser;

static bool fail_at(parser *p, size_t pos, const char *what) {
    if (!p->what) p->what = what, p->at = pos;
    return false;
}

static bool oom(parser *p) { return fail_at(p, p->pos, "out of memory"); }

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static bool at_end(const parser *p) { return p->pos >= p->len; }

static int hex4(const char *s) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* One \uXXXX escape at p->pos (just past the 'u'), a surrogate pair taken whole. */
static bool unicode_escape(parser *p, uint32_t *cp) {
    size_t at = p->pos - 2;
    if (p->len - p->pos < 4 || hex4(p->s + p->pos) < 0) return fail_at(p, at, "bad \\u escape");
    uint32_t hi = (uint32_t)hex4(p->s + p->pos);
    p->pos += 4;
    if (hi >= 0xdc00 && hi <= 0xdfff) return fail_at(p, at, "lone low surrogate");
    if (hi < 0xd800 || hi > 0xdbff) {
        *cp = hi;
        return true;
    }
    if (p->len - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
        return fail_at(p, at, "lone high surrogate");
    int lo = hex4(p->s + p->pos + 2);
    if (lo < 0xdc00 || lo > 0xdfff) return fail_at(p, at, "lone high surrogate");
    p->pos += 6;
    *cp = 0x10000 + ((hi - 0xd800) << 10) + ((uint32_t)lo - 0xdc00);
    return true;
}

/* A string at p->pos (the opening quote). Decoded text never outgrows the raw text, so one allocation. */
static bool parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = ++p->pos;
    size_t close = start;
    while (close < p->len && p->s[close] != '"') close += p->s[close] == '\\' ? 2 : 1;
    if (close >= p->len) return fail_at(p, start - 1, "unterminated string");
    char *buf = malloc(close - start + 1);
    if (!buf) return oom(p);
    size_t n = 0;
    while (p->pos < close) {
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c < 0x20) {
            free(buf);
            return fail_at(p, p->pos, "control character in string");
        }
        if (c != '\\') {
            size_t seq = utf8_sequence((const unsigned char *)p->s + p->pos, close - p->pos);
            if (!seq) {
                free(buf);
                return fail_at(p, p->pos, "invalid UTF-8 in string");
            }
            memcpy(buf + n, p->s + p->pos, seq);
            n += seq;
            p->pos += seq;
            continue;
        }
        char e = p->s[p->pos + 1];
        p->pos += 2;
        uint32_t cp;
        switch (e) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!unicode_escape(p, &cp)) {
                free(buf);
                return false;
            }
            break;
        default:
            free(buf);
            return fail_at(p, p->pos - 2, "bad escape in string");
        }
        n += utf8_encode(cp, buf + n);
    }
    if (p->pos != close) { /* an escape ran over the closing quote */
        free(buf);
        return fail_at(p, start - 1, "unterminated string");
    }
    p->pos = close + 1;
    buf[n] = 0;
    *out = buf;
    *out_len = n;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static bool parse_number(parser *p, berm_json *out) {
    size_t start = p->pos;
    const char *s = p->s;
    if (s[p->pos] == '-') p->pos++;
    if (at_end(p) || !is_digit(s[p->pos])) return fail_at(p, start, "bad number");
    if (s[p->pos] == '0') p->pos++;
    else
        while (!at_end(p) && is_digit(s[p->pos])) p->pos++;
    bool integral = true;
    if (!at_end(p) && s[p->pos] == '.') {
        integral = false;
        p->pos++;
        if (at_end(p) || !is_digit(s[p->pos])) return fail_at(p, start, "bad number");
        while (!at_end(p) && is_digit(s[p->pos])) p->pos++;
    }
    if (!at_end(p) && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        integral = false;
        p->pos++;
        if (!at_end(p) && (s[p->pos] == '+' || s[p->pos] == '-')) p->pos++;
        if (at_end(p) || !is_digit(s[p->pos])) return fail_at(p, start, "bad number");
        while (!at_end(p) && is_digit(s[p->pos])) p->pos++;
    }
    char *text = malloc(p->pos - start + 1);
    if (!text) return oom(p);
    memcpy(text, s + start, p->pos - start);
    text[p->pos - start] = 0;
    out->str = text;
    out->len = p->pos - start;
    out->type = integral && berm_parse_int((berm_str){text, out->len}, &out->integer) ? BERM_JSON_INT
                                                                                      : BERM_JSON_NUMBER;
    return true;
}

static bool parse_value(parser *p, berm_json *out, int depth);

/* Grow an array of `size`-byte elements to hold one more than `count`. */
static bool grow(parser *p, void **items, size_t count, size_t *cap, size_t size) {
    if (count < *cap) return true;
    size_t fresh = *cap ? *cap * 2 : 4;
    void *bigger = realloc(*items, fresh * size);
    if (!bigger) return oom(p);
    *items = bigger;
    *cap = fresh;
    return true;
}

static bool parse_array(parser *p, berm_json *out, int depth) {
    out->type = BERM_JSON_ARRAY;
    size_t cap = 0;
    p->pos++;
    skip_ws(p);
    if (!at_end(p) && p->s[p->pos] == ']') {
        p->pos++;
        return true;
    }
    for (;;) {
        if (!grow(p, (void **)&out->items, out->count, &cap, sizeof *out->items)) return false;
        /* counted before parsing so that an error frees whatever the item had allocated */
        if (!parse_value(p, &out->items[out->count++], depth + 1)) return false;
        skip_ws(p);
        if (at_end(p)) return fail_at(p, p->pos, "unterminated array");
        char c = p->s[p->pos++];
        if (c == ']') return true;
        if (c != ',') return fail_at(p, p->pos - 1, "expected ',' or ']'");
    }
}

static int by_key(const void *a, const void *b) {
    const berm_json_member *x = *(const berm_json_member *const *)a, *y = *(const berm_json_member *const *)b;
    int c = memcmp(x->key, y->key, x->key_len < y->key_len ? x->key_len : y->key_len);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* An object just closed holds no key twice, else an error naming it, as the Rust SDK's parser: which of the two
 * would a reader take? (Found by a review: the C SDK took the last in nested objects, where the Rust SDK refused
 * the document.) Sorted, so that 100,000 keys cost no more than their sort. */
static bool keys_unique(parser *p, const berm_json *object) {
    if (object->count < 2) return true;
    const berm_json_member **sorted = malloc(object->count * sizeof *sorted);
    if (!sorted) return oom(p);
    for (size_t i = 0; i < object->count; i++) sorted[i] = &object->members[i];
    qsort(sorted, object->count, sizeof *sorted, by_key);
    const berm_json_member *twice = NULL;
    for (size_t i = 1; i < object->count && !twice; i++)
        if (by_key(&sorted[i - 1], &sorted[i]) == 0) twice = sorted[i];
    free(sorted);
    if (!twice) return true;
    size_t shown = twice->key_len > 32 ? 32 : twice->key_len;
    while (shown < twice->key_len && (twice->key[shown] & 0xC0) == 0x80) shown--; /* not inside a character */
    snprintf(p->repeated, sizeof p->repeated, "key \"%.*s%s\" repeated", (int)shown, twice->key,
             twice->key_len > 32 ? "..." : "");
    return fail_at(p, p->pos, p->repeated);
}

static bool parse_object(parser *p, berm_json *out, int depth) {
    out->type = BERM_JSON_OBJECT;
    size_t cap = 0;
    p->pos++;
    skip_ws(p);
    if (!at_end(p) && p->s[p->pos] == '}') {
        p->pos++;
        return true;
    }
    for (;;) {
        skip_ws(p);
        if (at_end(p)) return fail_at(p, p->pos, "unterminated object");
        if (p->s[p->pos] != '"') return fail_at(p, p->pos, "expected a string key");
        if (!grow(p, (void **)&out->members, out->count, &cap, sizeof *out->members)) return false;
        berm_json_member *m = &out->members[out->count];
        *m = (berm_json_member){0};
        if (!parse_string(p, &m->key, &m->key_len)) return false;
        out->count++; /* counted now so that an error below frees the key */
        skip_ws(p);
        if (at_end(p) || p->s[p->pos] != ':') return fail_at(p, p->pos, "expected ':'");
        p->pos++;
        if (!parse_value(p, &m->value, depth + 1)) return false;
        skip_ws(p);
        if (at_end(p)) return fail_at(p, p->pos, "unterminated object");
        char c = p->s[p->pos++];
        if (c == '}') return keys_unique(p, out);
        if (c != ',') return fail_at(p, p->pos - 1, "expected ',' or '}'");
    }
}

static bool literal(parser *p, const char *word, berm_json *out, berm_json_type type, bool value) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return fail_at(p, p->pos, "unexpected character");
    p->pos += n;
    out->type = type;
    out->boolean = value;
    return true;
}

static bool parse_value(parser *p, berm_json *out, int depth) {
    *out = (berm_json){.type = BERM_JSON_NULL};
    skip_ws(p);
    if (at_end(p)) return fail_at(p, p->pos, "unexpected end of input");
    switch (p->s[p->pos]) {
    case '{':
    case '[': /* containers count as levels, the values inside the innermost do not (as in the Rust SDK) */
        if (depth > BERM_JSON_MAX_DEPTH) return fail_at(p, p->pos, "nesting too deep");
        return p->s[p->pos] == '{' ? parse_object(p, out, depth) : parse_array(p, out, depth);
    case '"':
        out->type = BERM_JSON_STRING;
        return parse_string(p, &out->str, &out->len);
    case 't': return literal(p, "true", out, BERM_JSON_BOOL, true);
    case 'f': return literal(p, "false", out, BERM_JSON_BOOL, false);
    case 'n': return literal(p, "null", out, BERM_JSON_NULL, false);
    default:
        if (p->s[p->pos] == '-' || is_digit(p->s[p->pos])) return parse_number(p, out);
        return fail_at(p, p->pos, "unexpected character");
    }
}

/* Frees what a node owns (not the node itself). */
static void release(berm_json *v) {
    switch (v->type) {
    case BERM_JSON_ARRAY:
        for (size_t i = 0; i < v->count; i++) release(&v->items[i]);
        free(v->items);
        break;
    case BERM_JSON_OBJECT:
        for (size_t i = 0; i < v->count; i++) {
            free((void *)v->members[i].key);
            release(&v->members[i].value);
        }
        free(v->members);
        break;
    default:
        free((void *)v->str);
    }
    *v = (berm_json){.type = BERM_JSON_NULL};
}

/* Room for the longest message: a repeated key's (64 bytes), " at byte " and 20 digits. */
#define ERROR_CAP 96

berm_json_parsed berm_json_parse(const char *text, size_t len) {
    parser p = {text, len, 0, NULL, 0, {0}};
    /* The message's room is taken first: running out of memory while parsing is then an error value like any
       other, where formatting it afterwards could find no room either and trap (found by a review). */
    char *error = malloc(ERROR_CAP);
    if (!error) berm_panic("out of memory before parsing JSON");
    berm_json *root = malloc(sizeof *root);
    if (!root) oom(&p);
    else if (parse_value(&p, root, 1)) {
        skip_ws(&p);
        if (!at_end(&p)) fail_at(&p, p.pos, "unexpected text after the value");
    }
    if (p.what) {
        if (root) release(root);
        free(root);
        snprintf(error, ERROR_CAP, "%s at byte %zu", p.what, p.at);
        return (berm_json_parsed){NULL, error};
    }
    free(error);
    return (berm_json_parsed){root, NULL};
}

void berm_json_free(berm_json *value) {
    if (!value) return;
    release(value);
    free(value);
}

const berm_json *berm_json_get(const berm_json *object, const char *key) {
    if (!object || object->type != BERM_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = object->count; i-- > 0;) {
        const berm_json_member *m = &object->members[i];
        if (m->key_len == n && memcmp(m->key, key, n) == 0) return &m->value;
    }
    return NULL;
}

const char *berm_json_type_name(berm_json_type type) {
    static const char *const names[] = {"null", "boolean", "integer", "number", "string", "array", "object"};
    return (unsigned)type < sizeof names / sizeof *names ? names[type] : "unknown";
}

/* ---------------------------------------------------------------- writer */

void berm_json_write_string(berm_buf *b, const char *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    berm_buf_putc(b, '"');
    size_t run = 0; /* bytes copied verbatim, flushed in one put */
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            run++, i++;
            continue;
        }
        size_t seq = c >= 0x80 ? utf8_sequence((const unsigned char *)s + i, len - i) : 0;
        if (seq) {
            run += seq, i += seq;
            continue;
        }
        berm_buf_put(b, s + i - run, run);
        run = 0;
        i++;
        switch (c) {
        case '"': berm_buf_puts(b, "\\\""); break;
        case '\\': berm_buf_puts(b, "\\\\"); break;
        case '\n': berm_buf_puts(b, "\\n"); break;
        case '\r': berm_buf_puts(b, "\\r"); break;
        case '\t': berm_buf_puts(b, "\\t"); break;
        case '\b': berm_buf_puts(b, "\\b"); break;
        case '\f': berm_buf_puts(b, "\\f"); break;
        default:
            if (c < 0x20) {
                char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                berm_buf_put(b, esc, sizeof esc);
            } else {
                berm_buf_puts(b, "\xef\xbf\xbd"); /* invalid UTF-8 byte -> U+FFFD */
            }
        }
    }
    berm_buf_put(b, s + len - run, run);
    berm_buf_putc(b, '"');
}

void berm_json_write_int(berm_buf *b, int64_t value) { berm_buf_printf(b, "%lld", (long long)value); }

void berm_json_write(berm_buf *b, const berm_json *v) {
    switch (v->type) {
    case BERM_JSON_NULL: berm_buf_puts(b, "null"); break;
    case BERM_JSON_BOOL: berm_buf_puts(b, v->boolean ? "true" : "false"); break;
    case BERM_JSON_INT:
    case BERM_JSON_NUMBER: berm_buf_put(b, v->str, v->len); break;
    case BERM_JSON_STRING: berm_json_write_string(b, v->str, v->len); break;
    case BERM_JSON_ARRAY:
        berm_buf_putc(b, '[');
        for (size_t i = 0; i < v->count; i++) {
            if (i) berm_buf_putc(b, ',');
            berm_json_write(b, &v->items[i]);
        }
        berm_buf_putc(b, ']');
        break;
    case BERM_JSON_OBJECT:
        berm_buf_putc(b, '{');
        for (size_t i = 0; i < v->count; i++) {
            if (i) berm_buf_putc(b, ',');
            berm_json_write_string(b, v->members[i].key, v->members[i].key_len);
            berm_buf_putc(b, ':');
            berm_json_write(b, &v->members[i].value);
        }
        berm_buf_putc(b, '}');
        break;
    }
}
