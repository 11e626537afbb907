/* tp_mux.h - one transport made of several: each peer is served by the
 * transport its route names (shared memory inside the node, the network
 * across nodes), and progress drives them all. */
#ifndef LOOM_TP_MUX_H
#define LOOM_TP_MUX_H

#include "transport.h"

#define LOOM_MUX_MAX 2

extern const loom_transport_ops_t loom_mux_transport;

/* Takes ownership of the connected transports; route[r] indexes ops/tps for
 * every rank r (our own rank included: where sends to self go). */
loom_status_t loom_mux_create(const loom_transport_ops_t *const *ops, loom_tp_t *const *tps,
                              int ntp, const int *route, int size, loom_err_t *err,
                              loom_tp_t **tp_p);

#endif
