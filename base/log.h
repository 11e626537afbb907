/* log.h - LOOM_DEBUG=WARN|INFO|TRACE (default: errors only, to stderr),
 * LOOM_DEBUG_SUBSYS=tcp,store,... to filter, LOOM_DEBUG_FILE=path (%h host,
 * %p pid). Never stdout. */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

typedef enum { LOOM_LOG_NONE = 0, LOOM_LOG_WARN, LOOM_LOG_INFO, LOOM_LOG_TRACE } loom_log_level_t;

/* What the logger reads: LOOM_DEBUG, LOOM_DEBUG_SUBSYS and LOOM_DEBUG_FILE
 * as they are (NULL when unset or empty). The logger interprets the strings
 * itself, since it has nobody to report a bad value to, and reads them
 * without the settings table (base/settings.c lists them), which logs. */
typedef struct loom_log_env {
    const char *level, *subsys, *file;
} loom_log_env_t;
void loom_log_env_read(loom_log_env_t *env, const char *(*get)(const char *name, void *arg),
                       void *arg);

/* The level in force (reads the environment once). */
loom_log_level_t loom_log_level(void);
void loom_log_write(loom_log_level_t level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOOM_LOG(level, subsys, ...)                                                    \
    do {                                                                                \
        if (loom_log_level() >= (level))                                                \
            loom_log_write((level), (subsys), __VA_ARGS__);                             \
    } while (0)
#define LOOM_WARN(subsys, ...) LOOM_LOG(LOOM_LOG_WARN, subsys, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG(LOOM_LOG_INFO, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG(LOOM_LOG_TRACE, subsys, __VA_ARGS__)

#endif
