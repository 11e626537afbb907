/* transports.c - the list of the transports this build has (transports.h).
 * The one place that names them: configure decides which are built. */
#include <string.h>

#include "transports.h"

extern const loom_transport_ops_t loom_shm_transport;       /* inside one node */
#ifdef LOOM_HAVE_VERBS
extern const loom_transport_ops_t loom_ibverbs_transport;   /* InfiniBand / RoCE */
#endif
extern const loom_transport_ops_t loom_tcp_transport;

const loom_transport_ops_t *const loom_transports[] = {
    &loom_shm_transport,
#ifdef LOOM_HAVE_VERBS
    &loom_ibverbs_transport,
#endif
    &loom_tcp_transport,
    NULL,
};

const loom_transport_ops_t *loom_transport_find(const char *name)
{
    for (int i = 0; loom_transports[i]; i++)
        if (strcmp(loom_transports[i]->name, name) == 0)
            return loom_transports[i];
    return NULL;
}
