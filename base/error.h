/* error.h - status plus readable message, threaded through every internal call. */
#ifndef LOOM_ERROR_H
#define LOOM_ERROR_H

#include "loom.h"

#define LOOM_ERRMSG_MAX 512

/* Where a failing function writes what went wrong. The first message written
 * wins, so the place that detected the error is what the user reads. */
typedef struct loom_err {
    loom_status_t status;
    char msg[LOOM_ERRMSG_MAX];
} loom_err_t;

/* Record status and message in err (if no message is recorded yet) and return
 * status, so a caller can write `return loom_err_set(err, LOOM_ERR_X, "...")`. */
loom_status_t loom_err_set(loom_err_t *err, loom_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Forget a recorded message (start of a new public call). */
void loom_err_clear(loom_err_t *err);

/* The message loom_comm_last_error returns (comm.c), for public calls:
 * record a failure as the communicator's last error, or as the calling
 * thread's when there is no communicator to hold it. */
loom_status_t loom_comm_fail(loom_comm_t c, loom_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
loom_status_t loom_global_fail(loom_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
