/* Timed wakes and events: the on_wake / on_notify arguments and the re-arm-before-body wrapper
 * (berm_recurring.h). */
#include "berm_recurring.h"

/* The invocation's arguments as a JSON object; NULL and *error set when they are not one. */
static berm_json *args_object(char **error) {
    berm_str args = berm_args();
    berm_json_parsed parsed = berm_json_parse(args.ptr ? args.ptr : "", args.len);
    free((void *)args.ptr);
    *error = parsed.error;
    if (parsed.value && parsed.value->type != BERM_JSON_OBJECT) {
        berm_json_free(parsed.value);
        *error = strdup("the arguments are not a JSON object");
        return NULL;
    }
    return parsed.value;
}

static const berm_json *typed(const berm_json *doc, const char *key, berm_json_type type) {
    const berm_json *v = berm_json_get(doc, key);
    return v && v->type == type ? v : NULL;
}

berm_wake berm_wake_args(void) {
    berm_wake wake = {0};
    wake.doc = args_object(&wake.error);
    if (!wake.doc) return wake;
    const berm_json *id = typed(wake.doc, "id", BERM_JSON_STRING);
    const berm_json *payload = typed(wake.doc, "payload", BERM_JSON_STRING);
    const berm_json *due = typed(wake.doc, "scheduled_at", BERM_JSON_INT);
    const berm_json *now = typed(wake.doc, "now", BERM_JSON_INT);
    if (!id || !payload || !due || !now) {
        berm_wake_free(&wake);
        wake.error = strdup("the wake's arguments are not {id, payload, scheduled_at, now}");
        return wake;
    }
    wake.id = (berm_str){id->str, id->len};
    wake.payload = (berm_str){payload->str, payload->len};
    wake.scheduled_at = due->integer;
    wake.now = now->integer;
    return wake;
}

berm_notify berm_notify_args(void) {
    berm_notify notify = {0};
    notify.doc = args_object(&notify.error);
    if (!notify.doc) return notify;
    const berm_json *topic = typed(notify.doc, "topic", BERM_JSON_STRING);
    const berm_json *event = typed(notify.doc, "event", BERM_JSON_STRING);
    if (!topic || !event) {
        berm_notify_free(&notify);
        notify.error = strdup("the event's arguments are not {topic, event}");
        return notify;
    }
    notify.topic = (berm_str){topic->str, topic->len};
    notify.event = (berm_str){event->str, event->len};
    return notify;
}

void berm_notify_free(berm_notify *notify) {
    berm_json_free(notify->doc);
    free(notify->error);
    *notify = (berm_notify){0};
}

void berm_wake_free(berm_wake *wake) {
    berm_json_free(wake->doc);
    free(wake->error);
    *wake = (berm_wake){0};
}

static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

int64_t berm_next_local_time(int64_t after_utc_ms, int64_t offset_seconds, int hour, int minute) {
    if (hour < 0 || hour > 23 || minute < 0 || minute > 59) return -1; /* no such time: -25:00 came out in the past */
    int64_t offset_ms = offset_seconds * 1000;
    int64_t local = after_utc_ms + offset_ms;
    int64_t next = floor_div(local, BERM_DAY_MS) * BERM_DAY_MS + ((int64_t)hour * 60 + minute) * BERM_MINUTE_MS;
    if (next <= local) next += BERM_DAY_MS;
    return next - offset_ms;
}

berm_result_t berm_recurring(const berm_wake *wake, berm_next_fn next, void *next_ctx, berm_body_fn body,
                             void *body_ctx) {
    berm_clock clock = berm_clock_now();
    if (clock.error) {
        berm_logf("recurring %.*s: not re-armed, the clock failed: %s", (int)wake->id.len, wake->id.ptr,
                  clock.error);
        free(clock.error);
    } else {
        int64_t when = next(&clock, next_ctx);
        if (when >= 0) {
            berm_reply armed = berm_schedule_at(when, wake->id, wake->payload);
            if (armed.error)
                berm_logf("recurring %.*s: re-arming failed: %s", (int)wake->id.len, wake->id.ptr, armed.error);
            berm_reply_free(&armed);
        }
    }
    return body(wake, body_ctx);
}

typedef struct {
    int hour, minute;
    int64_t scheduled_at; /* the occurrence being run */
} daily_time;

/* The next local hour:minute after the clock, and at least half a day after the occurrence being run: on the day
 * local time goes back an hour (or when the clock is stepped back), that occurrence, armed at the old offset,
 * wakes before its local time, and the next after the clock alone was the same time of the same day: delivered
 * twice (found by a review). */
static int64_t next_daily(const berm_clock *clock, void *ctx) {
    const daily_time *t = ctx;
    int64_t after = clock->utc_millis, half_day_on = t->scheduled_at + BERM_DAY_MS / 2;
    return berm_next_local_time(after > half_day_on ? after : half_day_on, clock->local_offset_seconds, t->hour,
                                t->minute);
}

berm_result_t berm_recurring_daily(const berm_wake *wake, int hour, int minute, berm_body_fn body, void *ctx) {
    daily_time t = {hour, minute, wake->scheduled_at};
    return berm_recurring(wake, next_daily, &t, body, ctx);
}
