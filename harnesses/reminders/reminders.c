/* reminders: one-shot and daily reminders kept in berm.kv, delivered by timed wakes.
 *
 * State (berm.kv, this harness's namespace):
 *   reminder/<id>                  {"id","text","when"} or {"id","text","daily":"HH:MM"}
 *   next_id                        decimal counter for ids r1, r2, ...
 *   outbox/<scheduled_at:020>/<id> {"id","text","scheduled_at","now"}: what was delivered (the embedder reads it)
 * berm.kv has no compare-and-set, so two `add` calls running at the same moment could pick the same id: a host
 * that calls this harness concurrently should limit it to one invocation at a time.
 * Each pending reminder has one wake in the host's due-set under the same id. A daily one re-arms itself before
 * delivering (berm_recurring_daily), at the next local HH:MM from berm.clock.now's offset at that moment. */
#include "berm.h"
#include "berm_recurring.h"

#define TEXT_MAX 2000
#define REMINDER_PREFIX "reminder/"
#define OUTBOX_PREFIX "outbox/"
/* The payload of the wake `add` arms, and how long after it finds no reminder it looks again (`add` stores the
 * reminder after arming its wake: on_wake; a reminder due at once, its wake run beside its `add`, is delivered that
 * much later, and so recorded in the outbox). A daily reminder's later wakes carry it on, and find their reminder. */
#define NEW_WAKE "new"
#define RECHECK_MS (30 * 1000LL)
/* The payload of a wake that only takes a delivered reminder's record away (removed). */
#define DELIVERED_WAKE "delivered"

typedef struct {
    char id[32];
    const char *text; /* points into doc */
    size_t text_len;
    int64_t when;     /* one-shot: its instant (UTC ms) */
    bool daily;
    int hour, minute; /* daily: local time of day */
    berm_json *doc;
} reminder;

/* ---------------------------------------------------------------- small helpers */

static berm_str key_of(const char *prefix, berm_str id, char *buf, size_t cap) {
    int n = snprintf(buf, cap, "%s%.*s", prefix, (int)id.len, id.ptr);
    return (berm_str){buf, (size_t)n < cap ? (size_t)n : cap - 1};
}

static const berm_json *member(const berm_json *obj, const char *key, berm_json_type type) {
    const berm_json *v = obj && obj->type == BERM_JSON_OBJECT ? berm_json_get(obj, key) : NULL;
    return v && v->type == type ? v : NULL;
}

static bool number(const char *s, size_t n, int *out) {
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return n > 0;
}

/* "HH:MM" (24-hour). */
static bool parse_hhmm(const char *s, size_t n, int *hour, int *minute) {
    return n == 5 && s[2] == ':' && number(s, 2, hour) && number(s + 3, 2, minute) && *hour < 24 && *minute < 60;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (the civil-from-days inverse, era arithmetic). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int y, int m) {
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return m == 2 && leap ? 29 : days[m - 1];
}

/* YYYY-MM-DD[T ]HH:MM[:SS[.fff…]][Z|±HH:MM]; without a zone the time is local (the clock's current offset). */
static bool parse_iso(const char *s, size_t n, int64_t offset_seconds, int64_t *out) {
    int y, mo, d, h, mi, sec = 0, millis = 0;
    if (n < 16 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != ' ') || !number(s, 4, &y) ||
        !number(s + 5, 2, &mo) || !number(s + 8, 2, &d) || !parse_hhmm(s + 11, 5, &h, &mi))
        return false;
    if (mo < 1 || mo > 12 || d < 1 || d > days_in_month(y, mo)) return false;
    size_t i = 16;
    if (i < n && s[i] == ':') {
        if (i + 3 > n || !number(s + i + 1, 2, &sec) || sec > 59) return false;
        i += 3;
        if (i < n && s[i] == '.') {  /* a fraction: milliseconds kept, finer digits dropped */
            size_t start = ++i;
            for (int scale = 100; i < n && s[i] >= '0' && s[i] <= '9'; i++, scale /= 10) millis += (s[i] - '0') * scale;
            if (i == start) return false;
        }
    }
    int64_t zone = offset_seconds;
    if (i < n && (s[i] == 'Z' || s[i] == 'z')) {
        zone = 0;
        i++;
    } else if (i < n && (s[i] == '+' || s[i] == '-')) {
        int zh, zm;
        if (i + 6 > n || !parse_hhmm(s + i + 1, 5, &zh, &zm)) return false;
        zone = (s[i] == '-' ? -1 : 1) * (int64_t)(zh * 3600 + zm * 60);
        i += 6;
    }
    if (i != n) return false;
    int64_t local_seconds = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec;
    *out = (local_seconds - zone) * 1000 + millis;
    return true;
}

/* ---------------------------------------------------------------- stored reminders */

/* The stored reminder `id`, or an error; *store_failed when the store could not be read (busy, failing), which
 * says nothing of whether the reminder exists: on_wake took any error for a cancelled reminder and a daily one
 * stopped for good, still listed (found by a review). */
static char *load_reminder(berm_str id, reminder *r, bool *store_failed) {
    *r = (reminder){0};
    *store_failed = false;
    /* an id holding a NUL is none: its key, written as C text, would stop there and name another reminder (found by
     * a review: "r1\u0000junk" deleted r1's record and left r1's wake, cancelled under the whole id) */
    if (id.len == 0 || id.len >= sizeof r->id || memchr(id.ptr, 0, id.len)) return strdup("no such reminder");
    char keybuf[64];
    berm_reply got = berm_kv_get(key_of(REMINDER_PREFIX, id, keybuf, sizeof keybuf));
    if (got.error) {
        *store_failed = !berm_kv_missing(&got);
        char *error = *store_failed ? berm_aprintf("reading reminder %.*s failed: %s", (int)id.len, id.ptr, got.error)
                                    : berm_aprintf("no reminder with id %.*s", (int)id.len, id.ptr);
        berm_reply_free(&got);
        return error;
    }
    berm_json_parsed parsed = berm_json_parse(got.data, got.len);
    berm_reply_free(&got);
    if (parsed.error) return parsed.error;
    const berm_json *text = member(parsed.value, "text", BERM_JSON_STRING);
    const berm_json *when = member(parsed.value, "when", BERM_JSON_INT);
    const berm_json *daily = member(parsed.value, "daily", BERM_JSON_STRING);
    if (!text || (!when && !(daily && parse_hhmm(daily->str, daily->len, &r->hour, &r->minute)))) {
        berm_json_free(parsed.value);
        return berm_aprintf("reminder %.*s is stored malformed", (int)id.len, id.ptr);
    }
    memcpy(r->id, id.ptr, id.len);
    r->text = text->str;
    r->text_len = text->len;
    r->daily = daily != NULL;
    r->when = when ? when->integer : 0;
    r->doc = parsed.value;
    return NULL;
}

/* The reminder as JSON; `next` is the UTC instant of its next occurrence. */
static void write_reminder(berm_buf *b, const reminder *r, int64_t next, bool with_next) {
    berm_buf_puts(b, "{\"id\":");
    berm_json_write_string(b, r->id, strlen(r->id));
    berm_buf_puts(b, ",\"text\":");
    berm_json_write_string(b, r->text, r->text_len);
    if (r->daily) berm_buf_printf(b, ",\"daily\":\"%02d:%02d\"", r->hour, r->minute);
    if (with_next || !r->daily) {
        berm_buf_puts(b, ",\"when\":");
        berm_json_write_int(b, next);
    }
    berm_buf_putc(b, '}');
}

static char *next_id(char *out, size_t cap) {
    int64_t n = 0;
    berm_reply got = berm_kv_get(BERM_STR("next_id"));
    if (!got.error && !berm_parse_int((berm_str){got.data, got.len}, &n)) n = 0;
    berm_reply_free(&got);
    char num[24], keybuf[64];
    /* skip ids in use (a counter lost to a failed write must not overwrite a reminder); an id the store could not
     * be asked about is not taken to be free (found by a review: a failing read gave that id away) */
    for (bool taken = true; taken;) {
        snprintf(out, cap, "r%lld", (long long)++n);
        got = berm_kv_get(key_of(REMINDER_PREFIX, berm_cstr(out), keybuf, sizeof keybuf));
        if (got.error && !berm_kv_missing(&got)) {
            char *error = berm_aprintf("reading reminder %s failed: %s", out, got.error);
            berm_reply_free(&got);
            return error;
        }
        taken = !got.error;
        berm_reply_free(&got);
    }
    int len = snprintf(num, sizeof num, "%lld", (long long)n);
    berm_reply set = berm_kv_set(BERM_STR("next_id"), (berm_str){num, (size_t)len});
    char *error = set.error;
    set.error = NULL;
    berm_reply_free(&set);
    return error;
}

/* ---------------------------------------------------------------- tools */

BERM_TOOL(add) {
    berm_str args = berm_args();
    berm_json_parsed parsed = berm_json_parse(args.ptr ? args.ptr : "", args.len);
    if (parsed.error) return berm_failf("add: the arguments are not JSON: %s", parsed.error);
    const berm_json *text = member(parsed.value, "text", BERM_JSON_STRING);
    const berm_json *at = member(parsed.value, "at", BERM_JSON_STRING);
    const berm_json *daily = member(parsed.value, "daily", BERM_JSON_STRING);
    if (!text || text->len == 0 || text->len > TEXT_MAX)
        return berm_failf("add: `text` must be a string of 1 to %d bytes", TEXT_MAX);
    if ((at == NULL) == (daily == NULL)) return berm_fail("add: give exactly one of `at` or `daily`");
    berm_clock clock = berm_clock_now();
    if (clock.error) return berm_failf("add: the clock failed: %s", clock.error);

    reminder r = {.text = text->str, .text_len = text->len, .daily = daily != NULL};
    int64_t when;
    if (daily) {
        if (!parse_hhmm(daily->str, daily->len, &r.hour, &r.minute))
            return berm_failf("add: `daily` must be HH:MM (24-hour), not \"%s\"", daily->str);
        when = berm_next_local_time(clock.utc_millis, clock.local_offset_seconds, r.hour, r.minute);
    } else if (parse_hhmm(at->str, at->len, &r.hour, &r.minute)) {
        when = berm_next_local_time(clock.utc_millis, clock.local_offset_seconds, r.hour, r.minute);
    } else if (!parse_iso(at->str, at->len, clock.local_offset_seconds, &when)) {
        return berm_failf("add: `at` must be an ISO-8601 time (2026-12-01T08:00:00Z, 2026-12-01T08:00) or HH:MM, "
                          "not \"%s\"", at->str);
    }
    r.when = when;
    char *error = next_id(r.id, sizeof r.id);
    if (error) return berm_failf("add: choosing an id failed: %s", error);

    /* The wake first, then the reminder: a host killed between the two leaves a wake that finds no reminder (gone,
     * as the unanswered `add` may be), never a reminder listed for ever with no wake (found by a review). Its
     * payload says it is new: run beside this `add` (due at once), it finds no reminder yet and looks again. */
    berm_reply armed = berm_schedule_at(when, berm_cstr(r.id), BERM_STR(NEW_WAKE));
    if (armed.error) return berm_failf("add: scheduling the reminder failed: %s", armed.error);
    berm_buf stored;
    berm_buf_init(&stored, 0);
    write_reminder(&stored, &r, when, false);
    char keybuf[64];
    berm_str key = key_of(REMINDER_PREFIX, berm_cstr(r.id), keybuf, sizeof keybuf);
    berm_reply set = berm_kv_set(key, (berm_str){stored.data, stored.len});
    if (set.error) {
        berm_reply_free(&armed);
        armed = berm_schedule_cancel(berm_cstr(r.id));
        return berm_failf("add: storing the reminder failed: %s", set.error);
    }
    berm_buf out;
    berm_buf_init(&out, 0);
    write_reminder(&out, &r, when, true);
    return berm_buf_finish(&out);
}

/* What `list` gathers: every reminder readable, with its next instant. */
typedef struct {
    reminder r;
    int64_t next;
    size_t order; /* its place among the keys: ties in `next` keep it */
} listed;

typedef struct {
    listed *items;
    size_t count, cap;
    berm_clock clock;
} listing;

static char *list_one(berm_str key, void *ctx) {
    listing *all = ctx;
    berm_str id = {key.ptr + strlen(REMINDER_PREFIX), key.len - strlen(REMINDER_PREFIX)};
    reminder r;
    bool store_failed;
    char *error = load_reminder(id, &r, &store_failed);
    if (error) {
        berm_logf("list: skipping %.*s: %s", (int)id.len, id.ptr, error);
        free(error);
        return NULL;
    }
    if (all->count == all->cap) {
        size_t cap = all->cap ? 2 * all->cap : 16;
        listed *bigger = realloc(all->items, cap * sizeof *bigger);
        if (!bigger) return strdup("out of memory");
        all->items = bigger;
        all->cap = cap;
    }
    int64_t next = r.daily ? berm_next_local_time(all->clock.utc_millis - 1, all->clock.local_offset_seconds, r.hour,
                                                  r.minute)
                           : r.when;
    all->items[all->count] = (listed){r, next, all->count};
    all->count++;
    return NULL;
}

static int soonest_first(const void *a, const void *b) {
    const listed *x = a, *y = b;
    if (x->next != y->next) return x->next < y->next ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

BERM_TOOL(list) {
    listing all = {.clock = berm_clock_now()};
    if (all.clock.error) return berm_failf("list: the clock failed: %s", all.clock.error);
    char *error = berm_kv_each(BERM_STR(REMINDER_PREFIX), list_one, &all);
    if (error) return berm_failf("list: %s", error);
    qsort(all.items, all.count, sizeof *all.items, soonest_first);
    berm_buf out;
    berm_buf_init(&out, 0);
    berm_buf_putc(&out, '[');
    for (size_t i = 0; i < all.count; i++) {
        if (i) berm_buf_putc(&out, ',');
        write_reminder(&out, &all.items[i].r, all.items[i].next, true);
    }
    berm_buf_putc(&out, ']');
    return berm_buf_finish(&out);
}

BERM_TOOL(cancel) {
    berm_str args = berm_args();
    berm_json_parsed parsed = berm_json_parse(args.ptr ? args.ptr : "", args.len);
    if (parsed.error) return berm_failf("cancel: the arguments are not JSON: %s", parsed.error);
    const berm_json *id = member(parsed.value, "id", BERM_JSON_STRING);
    if (!id) return berm_fail("cancel: `id` must be a string");
    reminder r;
    berm_str ids = {id->str, id->len};
    bool store_failed;
    char *error = load_reminder(ids, &r, &store_failed);
    if (error) return berm_failf("cancel: %s", error);
    /* the reminder first, then its wake: a host killed between the two leaves a wake that finds nothing, not a
     * reminder listed for ever with no wake (as `add` arms first: found by a review) */
    char keybuf[64];
    berm_reply deleted = berm_kv_delete(key_of(REMINDER_PREFIX, ids, keybuf, sizeof keybuf));
    if (deleted.error) return berm_failf("cancel: %s", deleted.error);
    berm_reply unarmed = berm_schedule_cancel(ids);
    if (unarmed.error) return berm_failf("cancel: %s", unarmed.error);
    berm_buf out;
    berm_buf_init(&out, 0);
    berm_buf_puts(&out, "{\"cancelled\":");
    berm_json_write_string(&out, id->str, id->len);
    berm_buf_putc(&out, '}');
    return berm_buf_finish(&out);
}

static char *deliveries_one(berm_str key, void *ctx) {
    berm_buf *out = ctx;
    berm_reply got = berm_kv_get(key);
    if (got.error) {
        berm_reply_free(&got);
        return NULL;
    }
    if (out->len > 1) berm_buf_putc(out, ',');
    berm_buf_put(out, got.data, got.len);
    berm_reply_free(&got);
    return NULL;
}

/* Every delivery, oldest first. The outbox grows by one a delivery: listed in one piece it was refused past
 * BERM_KV_LIST_PAGE keys (the tool failed for good after 10,000 deliveries: found by a review). */
BERM_TOOL(outbox) {
    berm_buf out;
    berm_buf_init(&out, 0);
    berm_buf_putc(&out, '[');
    char *error = berm_kv_each(BERM_STR(OUTBOX_PREFIX), deliveries_one, &out);
    if (error) {
        berm_buf_free(&out);
        return berm_failf("outbox: %s", error);
    }
    berm_buf_putc(&out, ']');
    return berm_buf_finish(&out);
}

/* ---------------------------------------------------------------- the wake */

/* Deliver one occurrence: a log line and an outbox entry, late or not (the wake says by how much). */
static berm_result_t deliver(const berm_wake *wake, void *ctx) {
    const reminder *r = ctx;
    int64_t late = wake->now - wake->scheduled_at;
    berm_logf("reminder %s: %.*s%s", r->id, (int)r->text_len, r->text, late > 60000 ? " (delivered late)" : "");
    berm_buf entry;
    berm_buf_init(&entry, 0);
    berm_buf_puts(&entry, "{\"id\":");
    berm_json_write_string(&entry, r->id, strlen(r->id));
    berm_buf_puts(&entry, ",\"text\":");
    berm_json_write_string(&entry, r->text, r->text_len);
    berm_buf_printf(&entry, ",\"scheduled_at\":%lld,\"now\":%lld}", (long long)wake->scheduled_at,
                    (long long)wake->now);
    char *key = berm_aprintf(OUTBOX_PREFIX "%020lld/%s", (long long)wake->scheduled_at, r->id);
    if (!key || !berm_buf_ok(&entry)) return berm_fail("on_wake: out of memory");
    berm_reply set = berm_kv_set(berm_cstr(key), (berm_str){entry.data, entry.len});
    if (set.error) return berm_failf("on_wake: writing the outbox failed: %s", set.error);
    return berm_ok_str("delivered");
}

static bool is(berm_str payload, const char *what) {
    return payload.len == strlen(what) && !memcmp(payload.ptr, what, payload.len);
}

/* A delivered one-shot's record taken away; when the store cannot, a wake a minute later tries again (delivering
 * nothing): a record left behind was a reminder listed for ever with no wake (found by a review). */
static berm_result_t removed(const berm_wake *wake) {
    char keybuf[64];
    berm_reply deleted = berm_kv_delete(key_of(REMINDER_PREFIX, wake->id, keybuf, sizeof keybuf));
    if (!deleted.error) return berm_ok_str("delivered");
    berm_reply again = berm_schedule_at(wake->now + BERM_MINUTE_MS, wake->id, BERM_STR(DELIVERED_WAKE));
    return berm_failf("on_wake: delivered, but removing it failed: %s (%s)", deleted.error,
                      again.error ? again.error : "tried again in a minute");
}

BERM_ON_WAKE {
    berm_wake wake = berm_wake_args();
    if (wake.error) return berm_failf("on_wake: %s", wake.error);
    reminder r;
    bool store_failed;
    char *error = load_reminder(wake.id, &r, &store_failed);
    if (error && store_failed) { /* try again in a minute: the reminder, stored or not, is not lost */
        berm_reply again = berm_schedule_at(wake.now + BERM_MINUTE_MS, wake.id, wake.payload);
        berm_result_t failed = berm_failf("on_wake: %s (%s)", error,
                                          again.error ? again.error : "woken again in a minute");
        berm_reply_free(&again);
        free(error);
        return failed;
    }
    if (error && is(wake.payload, NEW_WAKE)) {
        /* armed by an `add` that may not have stored the reminder yet: once more in a while */
        berm_reply again = berm_schedule_at(wake.now + RECHECK_MS, wake.id, BERM_STR(""));
        berm_result_t result = again.error ? berm_failf("on_wake: %s (%s)", error, again.error)
                                           : berm_ok_str("not stored yet: woken again in 30 s");
        berm_reply_free(&again);
        free(error);
        return result;
    }
    if (error) {  /* cancelled between arming and waking, or its `add` never stored it: nothing to deliver */
        berm_logf("on_wake: %s", error);
        return berm_ok_str("gone");
    }
    if (r.daily) return berm_recurring_daily(&wake, r.hour, r.minute, deliver, &r);
    if (!is(wake.payload, DELIVERED_WAKE)) {
        berm_result_t result = deliver(&wake, &r);
        if (result.len == 0) {  /* failed (it says so): the reminder kept, delivered again in a minute */
            berm_reply again = berm_schedule_at(wake.now + BERM_MINUTE_MS, wake.id, wake.payload);
            if (again.error) berm_logf("on_wake: arming the next try failed: %s", again.error);
            berm_reply_free(&again);
            return result;
        }
    }
    return removed(&wake);
}
