/* tp_fail.c - see tp_fail.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "tp_fail.h"

loom_status_t loom_tp_fail_gave_up(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                   int rank, int peer)
{
    return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                        "rank %d lost rank %d: rank %d gave up on this communicator (a failed "
                        "call or loom_comm_abort there)", rank, peer, peer);
}

loom_status_t loom_tp_fail_fault(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                 int rank, int from, const loom_tp_fault_t *f)
{
    char told[64] = "";
    if (from != f->reporter)
        snprintf(told, sizeof(told), "; rank %d told rank %d", from, rank);
    if (f->culprit >= 0 && f->why == LOOM_ERR_TIMEOUT)
        return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                            "rank %d stopped answering (rank %d gave up on it after %.1f s "
                            "LOOM_TIMEOUT%s)", f->culprit, f->reporter, f->waited_ms / 1000.0,
                            told);
    if (f->culprit >= 0)
        return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                            "rank %d was lost (rank %d gave up on it: %s%s)", f->culprit,
                            f->reporter, loom_strerror(f->why), told);
    return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                        "rank %d lost rank %d: rank %d gave up on this communicator (a failed "
                        "call or loom_comm_abort there: %s%s)", rank, f->reporter, f->reporter,
                        loom_strerror(f->why), told);
}

void loom_tp_own(_Atomic int *owner)
{
    int idle = 0;
    while (!atomic_compare_exchange_weak(owner, &idle, 1)) {
        idle = 0;
        sched_yield();   /* an abort is telling the peers: a few sends */
    }
}

void loom_tp_disown(_Atomic int *owner)
{
    atomic_store(owner, 0);
}

int loom_tp_own_if_idle(_Atomic int *owner)
{
    int idle = 0;
    return atomic_compare_exchange_strong(owner, &idle, 2);
}

loom_status_t loom_tp_leave(_Atomic int *owner, const loom_status_t *failed,
                            void (*announce)(loom_tp_t *), loom_tp_t *tp, loom_status_t st)
{
    if (*failed)
        announce(tp);
    loom_tp_disown(owner);
    return st;
}

loom_status_t loom_tp_fail(loom_status_t *failed, loom_err_t *err, const char *subsys, int rank,
                           loom_status_t st, const char *fmt, ...)
{
    if (*failed == LOOM_SUCCESS) {
        char msg[LOOM_ERRMSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        loom_err_set(err, st, "%s", msg);
        LOOM_INFO(subsys, "rank %d: %s", rank, msg);
        *failed = st;
    }
    return *failed;
}
