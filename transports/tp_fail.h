/* tp_fail.h - the sticky failure of a transport instance, as every transport
 * records it and tells its peers (the first failure wins; a peer that gave up
 * is named with the rank it blamed), and who may be inside an instance: the
 * one thread in isend/irecv/progress, or an abort. */
#ifndef LOOM_TP_FAIL_H
#define LOOM_TP_FAIL_H

#include "transport.h"

/* Record the first failure of an instance in *failed and err (later ones
 * keep the first); returns the status in force. */
loom_status_t loom_tp_fail(loom_status_t *failed, loom_err_t *err, const char *subsys, int rank,
                           loom_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Fail the instance because rank peer gave up on the communicator (its own
 * call failed, or it was aborted): the message every network transport gives. */
loom_status_t loom_tp_fail_gave_up(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                   int rank, int peer);

/* Fail the instance because rank from told us the communicator failed, with
 * what it said (fault): the message names the rank that stopped answering or
 * was lost, and the rank that gave up on it first, not only the rank that
 * passed the news on. LOOM_ERR_PEER_LOST, as for any rank that gave up. */
loom_status_t loom_tp_fail_fault(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                 int rank, int from, const loom_tp_fault_t *fault);

/* Keep the first fault an instance learns of (the one it passes on). */
static inline void loom_tp_fault_keep(loom_tp_fault_t *mine, const loom_tp_fault_t *f)
{
    if (mine->reporter < 0 && f && f->reporter >= 0)
        *mine = *f;
}

/* The fault ops of transport.h over the one an instance keeps: 1 and
 * *fault_p when it has one. */
static inline int loom_tp_fault_get(const loom_tp_fault_t *mine, loom_tp_fault_t *fault_p)
{
    if (mine->reporter < 0)
        return 0;
    *fault_p = *mine;
    return 1;
}

/* The sockets and queues of an instance belong to the one thread inside its
 * isend/irecv/progress (the caller runs one at a time); an abort, from any
 * thread, may use them only while none is inside. owner: 0 free, 1 taken by
 * that thread, 2 taken by an abort. */
void loom_tp_own(_Atomic int *owner);
void loom_tp_disown(_Atomic int *owner);
/* Take owner for an abort if nobody is inside: 1 when taken. */
int loom_tp_own_if_idle(_Atomic int *owner);
/* Leave an isend/irecv/progress with st: when the instance has failed
 * (*failed, read after st was computed), tell the peers first (announce
 * tells them once), then let owner go. */
loom_status_t loom_tp_leave(_Atomic int *owner, const loom_status_t *failed,
                            void (*announce)(loom_tp_t *), loom_tp_t *tp, loom_status_t st);

#endif
