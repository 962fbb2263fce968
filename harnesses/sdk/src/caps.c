/* Capabilities: requests encoded as frames (ABI.md §2), replies pulled with the staged-result protocol
 * (a length with BERM_ERROR_BIT set means the staged bytes are an error message). Errors are values. */
#include "berm.h"

void berm_reply_free(berm_reply *reply) {
    free(reply->data);
    free(reply->error);
    *reply = (berm_reply){0};
}

/* A heap message; running out of memory while reporting an error is the one failure left to trap. */
static char *checked(char *text) {
    if (!text) berm_panic("out of memory reporting a capability error");
    return text;
}

#define ERROR_TEXT(...) checked(berm_aprintf(__VA_ARGS__))

static void put_u32(char *out, uint32_t v) {
    for (int i = 0; i < 4; i++) out[i] = (char)(v >> (8 * i));
}

berm_reply berm_capability(uint64_t number, const berm_str *fields, size_t count) {
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        if (fields[i].len > 0xffffffffu) return (berm_reply){.error = ERROR_TEXT("a field of %zu bytes does not fit a frame", fields[i].len)};
        total += 4 + fields[i].len;
    }
    char *frame = malloc(total ? total : 1);
    if (!frame) return (berm_reply){.error = ERROR_TEXT("out of memory for a %zu-byte request", total)};
    char *w = frame;
    for (size_t i = 0; i < count; i++) {
        put_u32(w, (uint32_t)fields[i].len);
        memcpy(w + 4, fields[i].ptr, fields[i].len);
        w += 4 + fields[i].len;
    }
    uint64_t status = berm_host_call(number, (uint64_t)(uintptr_t)frame, total);
    free(frame);
    uint64_t len = status & ~BERM_ERROR_BIT;
    char *data = len < ((uint64_t)1 << 40) ? malloc((size_t)len + 1) : NULL;
    if (!data) return (berm_reply){.error = ERROR_TEXT("a reply of %llu bytes does not fit in guest memory", (unsigned long long)len)};
    berm_host_call(BERM_CALL_RESULT_READ, (uint64_t)(uintptr_t)data, len);
    data[len] = 0;
    if (status & BERM_ERROR_BIT) return (berm_reply){.error = data};
    return (berm_reply){.data = data, .len = (size_t)len};
}

berm_frame_reader berm_frame_reader_init(const char *data, size_t len) {
    return (berm_frame_reader){data, data + len, false};
}

bool berm_frame_next(berm_frame_reader *r, berm_str *field) {
    if (r->malformed || r->pos == r->end) return false;
    if (r->end - r->pos < 4) {
        r->malformed = true;
        return false;
    }
    const unsigned char *p = (const unsigned char *)r->pos;
    size_t n = (size_t)p[0] | (size_t)p[1] << 8 | (size_t)p[2] << 16 | (size_t)p[3] << 24;
    if (n > (size_t)(r->end - r->pos) - 4) {
        r->malformed = true;
        return false;
    }
    *field = (berm_str){r->pos + 4, n};
    r->pos += 4 + n;
    return true;
}

bool berm_parse_int(berm_str text, int64_t *out) {
    size_t i = 0;
    bool negative = text.len && text.ptr[0] == '-';
    if (negative) i++;
    if (i == text.len) return false;
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
    for (; i < text.len; i++) {
        char c = text.ptr[i];
        if (c < '0' || c > '9') return false;
        uint64_t d = (uint64_t)(c - '0');
        if (v > (limit - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = negative ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* Fixed fields then a flattened list of pairs (the last parameter, ABI.md §2). */
static berm_reply call_with_pairs(uint64_t number, const berm_str *fixed, size_t nfixed, const berm_pair *pairs,
                                  size_t npairs) {
    size_t count = nfixed + 2 * npairs;
    berm_str *fields = malloc(count * sizeof *fields);
    if (!fields) return (berm_reply){.error = ERROR_TEXT("out of memory for %zu request fields", count)};
    memcpy(fields, fixed, nfixed * sizeof *fields);
    for (size_t i = 0; i < npairs; i++) {
        fields[nfixed + 2 * i] = pairs[i].key;
        fields[nfixed + 2 * i + 1] = pairs[i].value;
    }
    berm_reply reply = berm_capability(number, fields, count);
    free(fields);
    return reply;
}

#define FIELDS(...) ((const berm_str[]){__VA_ARGS__}), sizeof((const berm_str[]){__VA_ARGS__}) / sizeof(berm_str)

berm_reply berm_fs_read(berm_str path) { return berm_capability(BERM_CALL_FS_READ, FIELDS(path)); }

berm_reply berm_fs_write(berm_str path, berm_str content) {
    return berm_capability(BERM_CALL_FS_WRITE, FIELDS(path, content));
}

berm_reply berm_fs_glob(berm_str pattern, berm_str path) {
    return berm_capability(BERM_CALL_FS_GLOB, FIELDS(pattern, path));
}

berm_reply berm_fs_grep(berm_str pattern, berm_str path, berm_str include, berm_str mode) {
    return berm_capability(BERM_CALL_FS_GREP, FIELDS(pattern, path, include, mode));
}

berm_reply berm_exec_run(berm_str command, berm_str cwd, const berm_pair *env, size_t env_count) {
    return call_with_pairs(BERM_CALL_EXEC_RUN, FIELDS(command, cwd), env, env_count);
}

berm_reply berm_kv_get(berm_str key) { return berm_capability(BERM_CALL_KV_GET, FIELDS(key)); }

/* What berm.kv.get says of a key it does not hold (berm_abi/names.py), after the capability's name. */
#define KV_MISSING "berm.kv.get: no value for key"

bool berm_kv_missing(const berm_reply *reply) {
    return reply->error && strncmp(reply->error, KV_MISSING, sizeof KV_MISSING - 1) == 0;
}

berm_reply berm_kv_set(berm_str key, berm_str value) { return berm_capability(BERM_CALL_KV_SET, FIELDS(key, value)); }

berm_reply berm_kv_delete(berm_str key) { return berm_capability(BERM_CALL_KV_DELETE, FIELDS(key)); }

berm_reply berm_schedule_cancel(berm_str id) { return berm_capability(BERM_CALL_SCHEDULE_CANCEL, FIELDS(id)); }

berm_reply berm_schedule_at(int64_t when_utc_millis, berm_str id, berm_str payload) {
    char when[24];
    int n = snprintf(when, sizeof when, "%lld", (long long)when_utc_millis);
    return berm_capability(BERM_CALL_SCHEDULE_AT, FIELDS(((berm_str){when, (size_t)n}), id, payload));
}

berm_reply berm_call(berm_str harness, berm_str tool, berm_str args) {
    return berm_capability(BERM_CALL_CALL, FIELDS(harness, tool, args));
}

/* Split a framed reply into exactly `count` fields; false (and reply->error set) when it is not that. */
static bool split_reply(berm_reply *reply, berm_str *fields, size_t count, const char *capability) {
    if (reply->error) return false;
    berm_frame_reader r = berm_frame_reader_init(reply->data, reply->len);
    size_t got = 0;
    berm_str extra;
    while (got < count && berm_frame_next(&r, &fields[got])) got++;
    if (got == count && !berm_frame_next(&r, &extra) && !r.malformed) return true;
    free(reply->data);
    *reply = (berm_reply){.error = ERROR_TEXT("malformed reply from %s: expected %zu fields", capability, count)};
    return false;
}

berm_http_response berm_http_fetch(berm_str method, berm_str url, berm_str body, const berm_pair *headers,
                                   size_t header_count) {
    berm_http_response out = {0};
    out.raw = call_with_pairs(BERM_CALL_HTTP_FETCH, FIELDS(method, url, body), headers, header_count);
    berm_str f[3];
    if (!split_reply(&out.raw, f, 3, "berm.http.fetch")) return out;
    if (!berm_parse_int(f[0], &out.status)) {
        char *error = ERROR_TEXT("malformed reply from berm.http.fetch: status %.*s is not a number",
                                 (int)(f[0].len > 40 ? 40 : f[0].len), f[0].ptr);
        berm_reply_free(&out.raw);
        out.raw.error = error;
        return out;
    }
    out.headers = f[1];
    out.body = f[2];
    return out;
}

berm_clock berm_clock_now(void) {
    berm_clock out = {0};
    berm_reply raw = berm_capability(BERM_CALL_CLOCK_NOW, NULL, 0);
    berm_str f[2];
    if (split_reply(&raw, f, 2, "berm.clock.now") &&
        !(berm_parse_int(f[0], &out.utc_millis) && berm_parse_int(f[1], &out.local_offset_seconds))) {
        berm_reply_free(&raw);
        raw.error = ERROR_TEXT("malformed reply from berm.clock.now: not two integers");
    }
    out.error = raw.error;
    raw.error = NULL;
    berm_reply_free(&raw);
    return out;
}

/* The keys of a berm.kv.list reply (it owns them). */
static berm_kv_keys kv_keys(berm_reply raw) {
    berm_kv_keys out = {0};
    out.raw = raw;
    if (out.raw.error) return out;
    berm_frame_reader r = berm_frame_reader_init(out.raw.data, out.raw.len);
    berm_str key;
    size_t cap = 0;
    while (berm_frame_next(&r, &key)) {
        if (out.count == cap) {
            cap = cap ? cap * 2 : 8;
            berm_str *bigger = realloc(out.keys, cap * sizeof *bigger);
            if (!bigger) {
                berm_kv_keys_free(&out);
                out.raw.error = ERROR_TEXT("out of memory for %zu keys from berm.kv.list", cap);
                return out;
            }
            out.keys = bigger;
        }
        out.keys[out.count++] = key;
    }
    if (r.malformed) {
        berm_kv_keys_free(&out);
        out.raw.error = ERROR_TEXT("malformed reply from berm.kv.list");
    }
    return out;
}

berm_kv_keys berm_kv_list(berm_str prefix) { return kv_keys(berm_capability(BERM_CALL_KV_LIST, FIELDS(prefix))); }

berm_kv_keys berm_kv_list_page(berm_str prefix, berm_str after) {
    return kv_keys(berm_capability(BERM_CALL_KV_LIST, FIELDS(prefix, after)));
}

char *berm_kv_each(berm_str prefix, char *(*visit)(berm_str key, void *ctx), void *ctx) {
    char *after = NULL; /* the last key of the previous full page, copied: the page's memory goes with it */
    size_t after_len = 0;
    for (;;) {
        berm_kv_keys page = berm_kv_list_page(prefix, (berm_str){after ? after : "", after_len});
        char *error = page.raw.error ? ERROR_TEXT("%s", page.raw.error) : NULL;
        for (size_t i = 0; !error && i < page.count; i++) error = visit(page.keys[i], ctx);
        bool more = !error && page.count == BERM_KV_LIST_PAGE;
        free(after);
        after = NULL;
        if (more) {
            berm_str last = page.keys[page.count - 1];
            after = malloc(last.len ? last.len : 1);
            if (after) memcpy(after, last.ptr, last.len);
            else error = ERROR_TEXT("out of memory for a key of %zu bytes from berm.kv.list", last.len);
            after_len = last.len;
        }
        berm_kv_keys_free(&page);
        if (error || !more) return error;
    }
}

void berm_kv_keys_free(berm_kv_keys *keys) {
    free(keys->keys);
    berm_reply_free(&keys->raw);
    *keys = (berm_kv_keys){0};
}
