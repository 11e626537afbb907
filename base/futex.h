/*
 * futex.h - sleeping on a 32-bit word in memory that other processes map
 * (shared, not private futexes): the shared-memory transport's doorbell and
 * the staging windows' fences. Linux only, as the transport is.
 */
#ifndef LOOM_FUTEX_H
#define LOOM_FUTEX_H

#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline void loom_futex_wake(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Sleeps while *word == seen, at most timeout_ms (< 0: no limit); a wake, a
 * signal or a changed word end it early. */
static inline void loom_futex_wait(_Atomic uint32_t *word, uint32_t seen, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, seen, timeout_ms < 0 ? NULL : &ts, NULL, 0);
}

#endif
