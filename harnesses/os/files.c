/* read, write, edit: files under the declared root, through berm.fs.read and berm.fs.write. */
#include "os.h"

void os_arg_nonempty(berm_arg_set *a, const char *key, berm_str *out) {
    berm_arg_string(a, key, true, out);
    if (!a->error && out->len == 0) berm_args_problem(a, "'%s' must not be empty", key);
}

static int64_t count_lines(const char *data, size_t len) {
    int64_t n = 0;
    for (const char *p = data, *end = data + len; (p = memchr(p, '\n', (size_t)(end - p))); p++) n++;
    return n + (len && data[len - 1] != '\n');
}

BERM_TOOL(read) {
    static const char *const known[] = {"path", "offset", "limit", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str path = {0};
    int64_t offset = 1, limit = 2000;
    os_arg_nonempty(&a, "path", &path);
    berm_arg_int(&a, "offset", false, 0, INT64_MAX, &offset);
    berm_arg_int(&a, "limit", false, 1, INT64_MAX, &limit);
    if (a.error) return berm_fail(a.error);
    berm_reply file = berm_fs_read(path);
    if (file.error) return berm_fail(file.error);
    if (!berm_utf8_valid(file.data, file.len)) return berm_failf("%.*s is not valid UTF-8", (int)path.len, path.ptr);

    int64_t total = count_lines(file.data, file.len);
    int64_t first = offset ? offset : 1;
    if (first > total && !(total == 0 && first == 1))
        return berm_ok_str(berm_aprintf("--- %lld total lines (offset %lld is past end of file) ---",
                                        (long long)total, (long long)offset));
    int64_t last = limit > total - first ? total : first + limit - 1;

    berm_buf out;
    berm_buf_init(&out, OS_OUTPUT_LIMIT + 256); /* the footer always fits */
    const char *line = file.data, *end = file.data + file.len;
    int64_t shown = first - 1;
    for (int64_t n = 1; n <= last; n++) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        const char *stop = nl ? nl : end;
        if (n >= first) {
            size_t len = (size_t)(stop - line);
            if (len && line[len - 1] == '\r') len--;
            size_t keep = len;
            if (keep > OS_LINE_LIMIT) /* cut on a character boundary */
                for (keep = OS_LINE_LIMIT; keep && ((unsigned char)line[keep] & 0xC0) == 0x80; keep--) {}
            if (out.len + keep + 64 > OS_OUTPUT_LIMIT) break; /* the line and its marks would not fit */
            berm_buf_putu(&out, (uint64_t)n);
            berm_buf_putc(&out, '\t');
            berm_buf_put(&out, line, keep);
            if (keep < len) berm_buf_printf(&out, " [... %zu more bytes on this line]", len - keep);
            berm_buf_putc(&out, '\n');
            shown = n;
        }
        line = stop + 1;
    }
    if (shown < last)
        berm_buf_printf(&out, "\n--- %lld total lines (showing lines %lld-%lld: the output limit; read on with "
                        "offset=%lld) ---", (long long)total, (long long)first, (long long)shown, (long long)shown + 1);
    else if (first == 1 && last == total) berm_buf_printf(&out, "\n--- %lld total lines ---", (long long)total);
    else
        berm_buf_printf(&out, "\n--- %lld total lines (showing lines %lld-%lld) ---", (long long)total,
                        (long long)first, (long long)last);
    return berm_buf_finish(&out);
}

BERM_TOOL(write) {
    static const char *const known[] = {"path", "content", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str path = {0}, content = {0};
    os_arg_nonempty(&a, "path", &path);
    berm_arg_string(&a, "content", true, &content);
    if (a.error) return berm_fail(a.error);
    berm_reply done = berm_fs_write(path, content);
    if (done.error) return berm_fail(done.error);
    return berm_ok_str(berm_aprintf("wrote %zu bytes to %.*s", content.len, (int)path.len, path.ptr));
}

/* How many times `needle` occurs in [data, data + len), not overlapping; *first is the first. */
static size_t occurrences(const char *data, size_t len, berm_str needle, const char **first) {
    const char *end = data + len;
    size_t count = 0;
    for (const char *p = data; (p = berm_memmem(p, (size_t)(end - p), needle.ptr, needle.len)); p += needle.len) {
        if (!count) *first = p;
        count++;
    }
    return count;
}

/* `s` with every "\n" not already after a "\r" made "\r\n" (heap; ptr NULL when out of memory). */
static berm_str with_crlf(berm_str s) {
    char *out = malloc(2 * s.len + 1);
    if (!out) return (berm_str){0};
    size_t n = 0;
    for (size_t i = 0; i < s.len; i++) {
        if (s.ptr[i] == '\n' && (i == 0 || s.ptr[i - 1] != '\r')) out[n++] = '\r';
        out[n++] = s.ptr[i];
    }
    return (berm_str){out, n};
}

BERM_TOOL(edit) {
    static const char *const known[] = {"path", "old_string", "new_string", NULL};
    berm_arg_set a = berm_args_object(known);
    berm_str path = {0}, old = {0}, new = {0};
    os_arg_nonempty(&a, "path", &path);
    berm_arg_string(&a, "old_string", true, &old);
    berm_arg_string(&a, "new_string", true, &new);
    if (a.error) return berm_fail(a.error);
    if (old.len == 0) return berm_fail("old_string must not be empty");
    if (old.len == new.len && memcmp(old.ptr, new.ptr, old.len) == 0)
        return berm_fail("old_string and new_string are identical");

    berm_reply file = berm_fs_read(path);
    if (file.error) return berm_fail(file.error);
    const char *hit = NULL;
    size_t count = occurrences(file.data, file.len, old, &hit);
    if (memchr(old.ptr, '\n', old.len) && berm_memmem(file.data, file.len, "\r\n", 2)) {
        /* read shows CRLF lines without their \r: they match too, and are replaced with the file's own line ends.
         * Where both forms occur, read shows both alike: not unique (found by a review: the bare one was
         * replaced, and the edit said ok). */
        berm_str crlf_old = with_crlf(old);
        if (!crlf_old.ptr) return berm_failf("out of memory editing a %zu-byte file", file.len);
        const char *crlf_hit = NULL;
        size_t crlf_count = crlf_old.len == old.len ? 0 : occurrences(file.data, file.len, crlf_old, &crlf_hit);
        if (count == 0 && crlf_count) {
            old = crlf_old;
            new = with_crlf(new);
            if (!new.ptr) return berm_failf("out of memory editing a %zu-byte file", file.len);
            hit = crlf_hit;
        }
        count += crlf_count;
    }
    if (count == 0) return berm_fail("old_string not found");
    if (count > 1) return berm_failf("old_string is not unique, found %zu occurrences", count);
    /* counted without overlaps (in "aaaa", "aa" twice): one that overlaps the first is a second place it matches,
     * and edit would have picked the first silently (found by a review: "}\n}\n" in "x}\n}\n}\n") */
    if (berm_memmem(hit + 1, file.len - (size_t)(hit - file.data) - 1, old.ptr, old.len))
        return berm_fail("old_string is not unique: it occurs again overlapping its first occurrence");

    size_t before = (size_t)(hit - file.data), after = file.len - before - old.len;
    char *edited = malloc(before + new.len + after + 1);
    if (!edited) return berm_failf("out of memory editing a %zu-byte file", file.len);
    memcpy(edited, file.data, before);
    memcpy(edited + before, new.ptr, new.len);
    memcpy(edited + before + new.len, hit + old.len, after);
    berm_reply_free(&file);
    berm_reply done = berm_fs_write(path, (berm_str){edited, before + new.len + after});
    if (done.error) return berm_fail(done.error);
    return berm_ok_str("ok");
}
