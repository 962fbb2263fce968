/* berm_recurring.h — timed wakes and events for C harnesses: the on_wake and on_notify exports, their arguments,
 * and the recurring wrapper.
 *
 * The host schedules one-shots only: "wake harness H at instant T with payload P" (RFC 0205, Scheduling).
 * Recurrence is a harness re-arming itself when it wakes, and this wrapper does it in the one safe order:
 * re-arm FIRST, run the body SECOND, so a body that traps costs one occurrence rather than the schedule (and so
 * does a host crash in mid-body: the re-arm replaced the occurrence the host would otherwise deliver again).
 *
 *     #include "berm_recurring.h"
 *
 *     static berm_result_t report(const berm_wake *wake, void *ctx) { ...; return berm_ok_str("done"); }
 *
 *     BERM_ON_WAKE {
 *         berm_wake wake = berm_wake_args();
 *         if (wake.error) return berm_fail(wake.error);
 *         return berm_recurring_daily(&wake, 8, 0, report, NULL);    // every day at 08:00 local time
 *     }
 *
 * The wake's arguments are the JSON {"id", "payload", "scheduled_at", "now"} (UTC milliseconds): a wake that
 * arrives late (the daemon was down) says so, and the harness decides what a missed occurrence means. To deliver
 * every missed occurrence, do so in that one wake and re-arm in the future: re-arming each in the past is a chain
 * of wakes, which the host cuts after a few links (berm_host/queue/capability.py).
 *
 * Local time: each re-arm asks berm.clock.now for UTC and the host's current UTC offset and resolves the next
 * local wall-clock instant from them. DST is handled by construction: the offset is re-read at every re-arm, so
 * after a change at most the one occurrence armed across it lands an hour off local time, never the schedule, and
 * it is delivered once.
 * Needs the clock and schedule capabilities granted.
 */
#ifndef BERM_RECURRING_H
#define BERM_RECURRING_H

#include "berm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The exports the host enters for a timed wake / a subscribed event. `retain` keeps them through
 * --gc-sections: nothing in the image calls them. They return like a tool (result or berm_fail). */
#define BERM_ON_WAKE __attribute__((used, retain)) berm_result_t on_wake(void)
#define BERM_ON_NOTIFY __attribute__((used, retain)) berm_result_t on_notify(void)
berm_result_t on_wake(void);
berm_result_t on_notify(void);

#define BERM_MINUTE_MS 60000LL
#define BERM_DAY_MS 86400000LL

/** The arguments of one wake. `id` and `payload` point into `doc`; free with berm_wake_free. */
typedef struct {
    berm_str id, payload;
    int64_t scheduled_at; /* the instant this occurrence was due (UTC ms) */
    int64_t now;          /* when it was delivered (UTC ms) */
    berm_json *doc;
    char *error;          /* set when the arguments are not a wake's: nothing else is valid then */
} berm_wake;

berm_wake berm_wake_args(void);
void berm_wake_free(berm_wake *wake);

/** The arguments of one event (``on_notify``): the topic it was published on and the event text. */
typedef struct {
    berm_str topic, event;
    berm_json *doc;
    char *error;
} berm_notify;

berm_notify berm_notify_args(void);
void berm_notify_free(berm_notify *notify);

/** The first UTC instant strictly after `after_utc_ms` at which local time (UTC + offset) reads hour:minute; -1
 *  when hour:minute is no time of day (hour 0-23, minute 0-59). */
int64_t berm_next_local_time(int64_t after_utc_ms, int64_t offset_seconds, int hour, int minute);

/** When to wake next, from the clock at the re-arm; return < 0 to stop recurring. */
typedef int64_t (*berm_next_fn)(const berm_clock *clock, void *ctx);
/** The occurrence's work. */
typedef berm_result_t (*berm_body_fn)(const berm_wake *wake, void *ctx);

/** Re-arm `wake->id` (same payload) at next(clock) first, then run body(wake). When the clock or the re-arm
 *  fails, the failure is logged and the body still runs: this occurrence is due either way. */
berm_result_t berm_recurring(const berm_wake *wake, berm_next_fn next, void *next_ctx, berm_body_fn body,
                             void *body_ctx);

/** berm_recurring with next = the next local hour:minute, at least half a day after the occurrence being run (so
 *  a day local time goes back an hour on, or a clock stepped back, never delivers one day's occurrence twice). */
berm_result_t berm_recurring_daily(const berm_wake *wake, int hour, int minute, berm_body_fn body, void *ctx);

#ifdef __cplusplus
}
#endif

#endif /* BERM_RECURRING_H */
