/* timeline.h - LOOM_TIMELINE=FILE: a Chrome-trace (chrome://tracing, Perfetto)
 * record of every operation per rank, with the time spent waiting inside it,
 * so a user can see where time goes. Each rank writes its own file: "%r" in
 * FILE is replaced by the rank, else the rank goes before the extension
 * (trace.json -> trace.0.json, trace.1.json, ...); tools/loom-timeline-merge
 * joins them into one trace with one row per rank. */
#ifndef LOOM_TIMELINE_H
#define LOOM_TIMELINE_H

typedef struct loom_timeline loom_timeline_t;

/* The process's timeline, opened by the first communicator that asks (with
 * its rank) and closed when the last one releases it. NULL when pattern is
 * NULL or empty, or the file cannot be written (a warning is logged: a trace
 * must never stop a job). */
loom_timeline_t *loom_timeline_acquire(const char *pattern, int rank);
void loom_timeline_release(loom_timeline_t *tl);
/* Microseconds on the wall clock, so ranks of one job line up. */
double loom_timeline_now_us(void);
/* One complete event ("ph":"X"); args_json is the inside of the args object
 * ("\"bytes\": 4") or NULL. Thread-safe. */
void loom_timeline_span(loom_timeline_t *tl, const char *name, const char *cat, double start_us,
                        double end_us, int tid, const char *args_json);
/* The path a rank writes, for messages and tests. */
void loom_timeline_path(const char *pattern, int rank, char *out, unsigned long outlen);

#endif
