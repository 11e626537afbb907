/* accel.c - the host-only accelerator table, and the table this build uses. */
#include <stdio.h>

#include "accel.h"

static loom_status_t null_coll_memory(const loom_coll_args_t *a, int nranks, int rank,
                                      int *on_device, int *device, loom_err_t *err)
{
    (void)a, (void)nranks, (void)rank, (void)err;
    *on_device = 0;
    *device = -1;
    return LOOM_SUCCESS;
}

static int null_ptr_memory(const void *p, int *device)
{
    (void)p, (void)device;
    return 0;
}

/* Unreachable: nothing is device memory. */
static loom_status_t null_run_coll(loom_comm_t c, int device, const loom_coll_args_t *a,
                                   int on_comm_worker, loom_accel_host_coll_fn run_host,
                                   void *host_arg, loom_err_t *err)
{
    (void)c, (void)device, (void)a, (void)on_comm_worker, (void)run_host, (void)host_arg;
    return loom_err_set(err, LOOM_ERR_UNSUPPORTED, "this build of Loom has no accelerator");
}

static loom_status_t null_run_p2p(loom_comm_t c, int device, int is_send, void *dbuf,
                                  size_t bytes, loom_accel_host_p2p_fn host, void *arg,
                                  loom_err_t *err)
{
    (void)c, (void)device, (void)is_send, (void)dbuf, (void)bytes, (void)host, (void)arg;
    return loom_err_set(err, LOOM_ERR_UNSUPPORTED, "this build of Loom has no accelerator");
}

static void null_comm(loom_comm_t c)
{
    (void)c;
}

static void null_describe(char *out, size_t len)
{
    snprintf(out, len, "none (built without an accelerator: host memory only)");
}

const loom_accel_ops_t loom_accel_null = {
    .size = sizeof(loom_accel_ops_t),
    .name = "null",
    .coll_memory = null_coll_memory,
    .ptr_memory = null_ptr_memory,
    .run_coll = null_run_coll,
    .run_p2p = null_run_p2p,
    .comm_quiesce = null_comm,
    .comm_release = null_comm,
    .describe = null_describe,
};

/* configure names the table (config.h); a strong reference, so that a static
 * link of the core pulls the backend in with it. */
extern const loom_accel_ops_t LOOM_ACCEL_TABLE;
const loom_accel_ops_t *const loom_accel = &LOOM_ACCEL_TABLE;
