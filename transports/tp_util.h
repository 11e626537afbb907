/* tp_util.h - pieces every transport needs the same way: the sticky failure
 * of an instance, request queues in posting order, and matching an arrived
 * message against the receives posted for its tag. */
#ifndef LOOM_TP_UTIL_H
#define LOOM_TP_UTIL_H

#include <sys/socket.h>

#include "transport.h"
#include "wire.h"

/* Record the first failure of an instance in *failed and err (later ones
 * keep the first); returns the status in force. */
loom_status_t loom_tp_fail(loom_status_t *failed, loom_err_t *err, const char *subsys, int rank,
                           loom_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* Fail the instance because rank peer gave up on the communicator (its own
 * call failed, or it was aborted): the message every network transport gives. */
loom_status_t loom_tp_fail_gave_up(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                   int rank, int peer);

/* The numeric host a network transport listens on: the interface
 * LOOM_SOCKET_IFNAME names (its IPv4 address, else its IPv6 one), else the
 * address that reaches the store, else loopback where the launcher says every
 * rank runs on this node, else the first IPv4 interface that is up and not
 * loopback. Sets p->err when the named interface has no address. */
loom_status_t loom_tp_choose_host(const loom_tp_params_t *p, char *host, size_t hostlen);

/* A numeric host ("10.0.0.1", "fe80::1%eth0") and port into a socket
 * address for a stream socket: 0, or -1 when either is not numeric. */
int loom_tp_numeric_addr(const char *host, const char *port, struct sockaddr_storage *ss,
                         socklen_t *len);

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

typedef struct loom_req_queue {
    loom_tp_req_t *head, *tail;
} loom_req_queue_t;

void loom_req_queue_push(loom_req_queue_t *q, loom_tp_req_t *req);
/* Unlink the oldest request (the queue must not be empty). */
loom_tp_req_t *loom_req_queue_pop(loom_req_queue_t *q);
/* Reset a request's transport-owned fields before it is queued. */
void loom_req_start(loom_tp_req_t *req);
/* Mark a request finished, all bytes moved. */
void loom_req_complete(loom_tp_req_t *req);
/* Unlink and return the oldest request posted for f's tag, after checking that
 * f fits it (length, descriptor, total): a mismatch sets *st (with the message
 * in err) and returns NULL, as does finding none (*st untouched). */
loom_tp_req_t *loom_req_queue_take(loom_req_queue_t *q, const loom_frame_t *f, int my_rank,
                                   loom_err_t *err, loom_status_t *st);

#endif
