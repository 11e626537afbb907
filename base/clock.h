/* clock.h - the one clock that deadlines, timeouts and measured waits use. */
#ifndef LOOM_CLOCK_H
#define LOOM_CLOCK_H

#include <time.h>

/* Seconds on CLOCK_MONOTONIC: a wall-clock step (NTP, an admin) must not
 * fire or stretch a timeout. */
static inline double loom_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
