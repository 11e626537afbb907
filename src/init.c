/*
 * init.c - loom_init: the world communicator of a launched job, from the
 * launcher's variables. A plain job forms it directly (comm.c); an elastic one
 * (LOOM_ELASTIC=1) joins the current epoch (elastic.c). Here, so that the
 * communicator code does not depend on the elastic layer built on it.
 */
#include "comm.h"
#include "base/log.h"

LOOM_API loom_status_t loom_init(loom_comm_t *comm)
{
    if (!comm)
        return loom_global_fail(LOOM_ERR_INVALID_ARG, "loom_init: NULL output pointer");
    loom_err_t err = {0};
    loom_settings_t cfg;
    loom_bootstrap_t b;
    loom_status_t st;
    if ((st = loom_comm_settings_load(&cfg, loom_getenv_process, NULL, &err)) != LOOM_SUCCESS ||
        (st = loom_bootstrap_from_env(loom_getenv_process, NULL, &b, &err)) != LOOM_SUCCESS)
        return loom_global_fail(st, "loom_init: %s", err.msg);
    LOOM_INFO("init", "rank %d of %d from %s variables, store %s", b.rank, b.size, b.source,
              b.store[0] ? b.store : "(none)");
    if (cfg.elastic) {
        if ((st = loom_elastic_init(&cfg, &b, comm, &err)) != LOOM_SUCCESS)
            return loom_global_fail(st, "loom_init: %s", err.msg);
        return LOOM_SUCCESS;
    }
    return loom_comm_create_world(&cfg, b.rank, b.size, b.store, comm);
}
