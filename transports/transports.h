/* transports.h - the transports of this build, in one list. The core makes,
 * routes and connects a communicator's transports by walking it (src/comm.c),
 * loom-info describes each (tools/loom-info.c), the tests find them by name:
 * a new transport adds its ops table to the list and is seen by all three. */
#ifndef LOOM_TRANSPORTS_H
#define LOOM_TRANSPORTS_H

#include "transport.h"

/* In routing order, NULL-terminated: each peer is served by the first
 * transport of the list that reaches it (shared memory inside a node before
 * the network ones, a faster network before a slower one); with
 * LOOM_TRANSPORT=auto the first network transport that opens is used. */
extern const loom_transport_ops_t *const loom_transports[];

/* The transport called name, or NULL when this build has none. */
const loom_transport_ops_t *loom_transport_find(const char *name);

#endif
