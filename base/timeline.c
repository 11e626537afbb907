#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "timeline.h"

struct loom_timeline {
    int refs;               /* under global_lock */
    FILE *f;
    int rank;
    int first;
    pthread_mutex_t lock;   /* the worker thread and the caller's thread both write */
};

void loom_timeline_path(const char *pattern, int rank, char *out, unsigned long outlen)
{
    const char *r = strstr(pattern, "%r");
    if (r) {
        snprintf(out, outlen, "%.*s%d%s", (int)(r - pattern), pattern, rank, r + 2);
        return;
    }
    const char *slash = strrchr(pattern, '/');
    const char *dot = strrchr(pattern, '.');
    if (dot && (!slash || dot > slash) && dot != pattern && dot[-1] != '/')
        snprintf(out, outlen, "%.*s.%d%s", (int)(dot - pattern), pattern, rank, dot);
    else
        snprintf(out, outlen, "%s.%d", pattern, rank);
}

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_timeline_t *global_timeline;

static loom_timeline_t *timeline_open(const char *pattern, int rank)
{
    char path[1024];
    loom_timeline_path(pattern, rank, path, sizeof(path));
    loom_timeline_t *tl = calloc(1, sizeof(*tl));
    if (!tl)
        return NULL;
    tl->f = fopen(path, "w");
    if (!tl->f) {
        LOOM_WARN("timeline", "LOOM_TIMELINE: cannot write %s: %s", path, strerror(errno));
        free(tl);
        return NULL;
    }
    tl->rank = rank;
    tl->first = 1;
    pthread_mutex_init(&tl->lock, NULL);
    /* Names the row of this rank when traces are merged. */
    fprintf(tl->f, "[\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": "
                   "{\"name\": \"rank %d\"}}", rank, rank);
    tl->first = 0;
    return tl;
}

loom_timeline_t *loom_timeline_acquire(const char *pattern, int rank)
{
    if (!pattern || !*pattern)
        return NULL;
    pthread_mutex_lock(&global_lock);
    if (!global_timeline)
        global_timeline = timeline_open(pattern, rank);
    loom_timeline_t *tl = global_timeline;
    if (tl)
        tl->refs++;
    pthread_mutex_unlock(&global_lock);
    return tl;
}

void loom_timeline_release(loom_timeline_t *tl)
{
    if (!tl)
        return;
    pthread_mutex_lock(&global_lock);
    int last = --tl->refs == 0;
    if (last)
        global_timeline = NULL;
    pthread_mutex_unlock(&global_lock);
    if (!last)
        return;
    fprintf(tl->f, "\n]\n");
    fclose(tl->f);
    pthread_mutex_destroy(&tl->lock);
    free(tl);
}

double loom_timeline_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

void loom_timeline_span(loom_timeline_t *tl, const char *name, const char *cat, double start_us,
                        double end_us, int tid, const char *args_json)
{
    if (!tl)
        return;
    pthread_mutex_lock(&tl->lock);
    fprintf(tl->f, "%s\n{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, "
                   "\"dur\": %.3f, \"pid\": %d, \"tid\": %d, \"args\": {%s}}",
            tl->first ? "" : ",", name, cat, start_us, end_us - start_us, tl->rank, tid,
            args_json ? args_json : "");
    tl->first = 0;
    pthread_mutex_unlock(&tl->lock);
}
