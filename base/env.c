/* env.c - loom_init's view of the launcher: the first family of variables that
 * is present wins (docs/launching.md; docs/design.md, "Settings"). */
#include <stdio.h>
#include <string.h>

#include "settings.h"

typedef struct launcher_vars {
    const char *source, *rank, *size, *local_rank;
} launcher_vars_t;

static const launcher_vars_t launchers[] = {
    {"LOOM", "LOOM_RANK", "LOOM_SIZE", "LOOM_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
};

static const char *nonempty(loom_getenv_fn get, void *arg, const char *name)
{
    const char *v = get(name, arg);
    return (v && *v) ? v : NULL;
}

loom_status_t loom_bootstrap_from_env(loom_getenv_fn get, void *arg, loom_bootstrap_t *b,
                                      loom_err_t *err)
{
    const launcher_vars_t *l = NULL;
    for (size_t i = 0; i < sizeof(launchers) / sizeof(launchers[0]) && !l; i++)
        if (nonempty(get, arg, launchers[i].rank) || nonempty(get, arg, launchers[i].size))
            l = &launchers[i];
    if (!l)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "cannot tell this process's rank: set LOOM_RANK and LOOM_SIZE, or start "
                            "it with loomrun, torchrun, srun or mpirun");

    const char *rank = nonempty(get, arg, l->rank), *size = nonempty(get, arg, l->size);
    if (!rank || !size)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s is set but %s is not", rank ? l->rank : l->size,
                            rank ? l->size : l->rank);
    long r, n, lr = -1;
    if (loom_parse_long(size, 1, 1 << 24, &n) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s=\"%s\" is not a positive integer",
                            l->size, size);
    if (loom_parse_long(rank, 0, n - 1, &r) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s=\"%s\" is not a rank in [0, %ld]",
                            l->rank, rank, n - 1);
    const char *local = nonempty(get, arg, l->local_rank);
    if (local && loom_parse_long(local, 0, n - 1, &lr) != 0)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "%s=\"%s\" is not a rank in [0, %ld]",
                            l->local_rank, local, n - 1);

    char store[sizeof(b->store)] = "";
    const char *uri = nonempty(get, arg, "LOOM_STORE");
    const char *maddr = nonempty(get, arg, "MASTER_ADDR"), *mport = nonempty(get, arg, "MASTER_PORT");
    long port;
    if (uri) {
        if (strlen(uri) >= sizeof(store))
            return loom_err_set(err, LOOM_ERR_INVALID_ARG, "LOOM_STORE is too long");
        strcpy(store, uri);
    } else if (maddr && mport) {
        if (loom_parse_long(mport, 1, 65535, &port) != 0)
            return loom_err_set(err, LOOM_ERR_INVALID_ARG, "MASTER_PORT=\"%s\" is not a port",
                                mport);
        /* An IPv6 literal needs brackets to be told apart from the port. */
        int v6 = strchr(maddr, ':') != NULL && maddr[0] != '[';
        if ((size_t)snprintf(store, sizeof(store), v6 ? "tcp://[%s]:%ld" : "tcp://%s:%ld", maddr,
                             port) >= sizeof(store))
            return loom_err_set(err, LOOM_ERR_INVALID_ARG, "MASTER_ADDR is too long");
    } else if (n > 1) {
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "no rendezvous store: set LOOM_STORE (tcp://host:port, redis://host:port or "
                            "file:///shared/dir) or MASTER_ADDR and MASTER_PORT");
    }

    b->rank = (int)r;
    b->size = (int)n;
    b->local_rank = (int)lr;
    strcpy(b->store, store);
    b->source = l->source;
    return LOOM_SUCCESS;
}
