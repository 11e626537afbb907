#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "log.h"

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static loom_log_level_t log_level = LOOM_LOG_NONE;
static FILE *log_file;
static char log_subsys[256];
static char log_host[64];

/* Expand %h (host) and %p (pid) so every rank of a job can log to its own file. */
static void expand_path(const char *pattern, char *out, size_t outlen)
{
    size_t o = 0;
    for (const char *p = pattern; *p && o + 1 < outlen; p++) {
        if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
            int n = p[1] == 'h' ? snprintf(out + o, outlen - o, "%s", log_host)
                                : snprintf(out + o, outlen - o, "%d", (int)getpid());
            o += n > 0 ? (size_t)n : 0;
            p++;
        } else {
            out[o++] = *p;
        }
    }
    out[o < outlen ? o : outlen - 1] = '\0';
}

void loom_log_env_read(loom_log_env_t *env, const char *(*get)(const char *name, void *arg),
                       void *arg)
{
    const char *v[3] = {get("LOOM_DEBUG", arg), get("LOOM_DEBUG_SUBSYS", arg),
                        get("LOOM_DEBUG_FILE", arg)};
    for (int i = 0; i < 3; i++)
        if (v[i] && !*v[i])
            v[i] = NULL;   /* an empty variable counts as unset, as for every setting */
    env->level = v[0];
    env->subsys = v[1];
    env->file = v[2];
}

static const char *process_getenv(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

static void log_init(void)
{
    gethostname(log_host, sizeof(log_host) - 1);
    /* Every string is taken as it is (an unknown level keeps the default). */
    loom_log_env_t env = {0};
    loom_log_env_read(&env, process_getenv, NULL);
    const char *level = env.level;
    if (level) {
        if (strcasecmp(level, "WARN") == 0)
            log_level = LOOM_LOG_WARN;
        else if (strcasecmp(level, "INFO") == 0)
            log_level = LOOM_LOG_INFO;
        else if (strcasecmp(level, "TRACE") == 0)
            log_level = LOOM_LOG_TRACE;
    }
    const char *subsys = env.subsys;
    if (subsys)
        snprintf(log_subsys, sizeof(log_subsys), ",%s,", subsys);
    log_file = stderr;
    const char *path = env.file;
    if (path && *path) {
        char expanded[1024];
        expand_path(path, expanded, sizeof(expanded));
        FILE *f = fopen(expanded, "a");
        if (f) {
            setvbuf(f, NULL, _IOLBF, 0);
            log_file = f;
        }
    }
}

loom_log_level_t loom_log_level(void)
{
    pthread_once(&log_once, log_init);
    return log_level;
}

void loom_log_write(loom_log_level_t level, const char *subsys, const char *fmt, ...)
{
    static const char *const names[] = {"", "WARN", "INFO", "TRACE"};
    if (log_subsys[0]) {
        char key[64];
        snprintf(key, sizeof(key), ",%s,", subsys);
        if (!strstr(log_subsys, key))
            return;
    }
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct timeval tv;
    gettimeofday(&tv, NULL);
    /* One fprintf per line so lines of concurrent threads do not interleave. */
    fprintf(log_file, "%s:%d %ld.%06ld LOOM %s [%s] %s\n", log_host, (int)getpid(),
            (long)tv.tv_sec, (long)tv.tv_usec, names[level], subsys, msg);
}
