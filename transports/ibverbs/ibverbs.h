/* ibverbs.h - what the verbs transport offers besides its ops table
 * (transports/transport.h): a device listing for loom-info. */
#ifndef LOOM_IBVERBS_H
#define LOOM_IBVERBS_H

#include <stdio.h>

/* Print the RDMA devices, ports, link layers and GIDs libibverbs sees, one
 * "#   " line each; says why when there are none. Returns the device count. */
int loom_ibverbs_list_devices(FILE *out);

#endif
