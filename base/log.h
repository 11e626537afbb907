/* log.h - LOOM_DEBUG=WARN|INFO|TRACE (default: errors only, to stderr),
 * LOOM_DEBUG_SUBSYS=tcp,store,... to filter, LOOM_DEBUG_FILE=path (%h host,
 * %p pid). Never stdout. */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

typedef enum { LOOM_LOG_NONE = 0, LOOM_LOG_WARN, LOOM_LOG_INFO, LOOM_LOG_TRACE } loom_log_level_t;

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
