/* loom-info: what this build of Loom has and which settings are in force,
 * like ucx_info / fi_info. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/settings.h"
#include "algorithms/algorithms.h"
#include "loom.h"
#include "base/reduce.h"
#ifdef LOOM_HAVE_VERBS
#include "transports/ibverbs/ibverbs.h"
#endif
#include "src/accel.h"

static void usage(void)
{
    printf("usage: loom-info [-h]\n"
           "Prints the build (version, transports, CPU reduction code), the network\n"
           "interfaces Loom may use, the algorithms, and every LOOM_* setting with its\n"
           "value in this environment.\n");
}

int main(int argc, char **argv)
{
    if (argc > 1) {
        usage();
        return strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ? 0 : 2;
    }
    printf("# Loom %s\n", loom_version());
#ifdef LOOM_HAVE_VERBS
    printf("#   transports:      tcp shm ibverbs (shm inside a node unless LOOM_SHM=0)\n");
#else
    printf("#   transports:      tcp shm (shm inside a node unless LOOM_SHM=0)\n");
#endif
#ifdef HAVE_HIREDIS
    printf("#   stores:          tcp file redis\n");
#else
    printf("#   stores:          tcp file\n");
#endif
    printf("#   CPU reductions:  %s\n", loom_reduce_isa());
    char accel[512];
    loom_accel->describe(accel, sizeof(accel));
    printf("#   accelerator:     %s\n", accel);
#ifdef LOOM_HAVE_VERBS
    printf("#   verbs:           built (libibverbs.so.1 loaded at run time)\n");
#else
    printf("#   verbs:           not built\n");
#endif

    printf("#\n# Network interfaces\n");
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *ifa = ifs; ifa; ifa = ifa->ifa_next) {
            if (!ifa->ifa_addr ||
                (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
                continue;
            char host[INET6_ADDRSTRLEN];
            const void *a = ifa->ifa_addr->sa_family == AF_INET
                                ? (const void *)&((struct sockaddr_in *)ifa->ifa_addr)->sin_addr
                                : (const void *)&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr;
            inet_ntop(ifa->ifa_addr->sa_family, a, host, sizeof(host));
            printf("#   %-12s %-40s %s%s\n", ifa->ifa_name, host,
                   (ifa->ifa_flags & IFF_UP) ? "up" : "down",
                   (ifa->ifa_flags & IFF_LOOPBACK) ? " loopback" : "");
        }
        freeifaddrs(ifs);
    }

#ifdef LOOM_HAVE_VERBS
    printf("#\n# RDMA devices (ibverbs)\n");
    fflush(stdout);
    loom_ibverbs_list_devices(stdout);
#endif

    printf("#\n# Algorithms (LOOM_ALGO=collective=name[@LO-HI],...)\n");
    for (int coll = 0; coll < LOOM_COLL_COUNT; coll++) {
        printf("#   %-15s", loom_coll_name((loom_coll_t)coll));
        for (size_t i = 0; i < loom_num_algorithms; i++)
            if ((int)loom_algorithms[i].coll == coll)
                printf(" %s", loom_algorithms[i].name);
        printf("\n");
    }

    printf("#\n# Settings (value in this environment, default, meaning)\n");
    for (size_t i = 0; i < loom_num_settings; i++) {
        const loom_setting_t *d = &loom_settings_table[i];
        const char *v = getenv(d->name);
        if (v && (d->flags & LOOM_SETTING_SECRET))
            v = "(set, not shown)";
        printf("%-22s %-16s default %-10s %s\n", d->name, v ? v : "(unset)",
               d->default_value ? d->default_value : "-", d->help);
    }
    return 0;
}
