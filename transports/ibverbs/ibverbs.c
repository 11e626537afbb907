/*
 * ibverbs.c - the InfiniBand / RoCE transport: one RC queue pair per peer,
 * connected through a short TCP side channel (QPN, PSN, LID, GID travel in a
 * record; no librdmacm), a send and a receive completion queue per instance
 * polled by whoever waits (no progress thread).
 *
 * Eager path: messages up to a slot (8 KiB with the header) are SENDs into
 * receive slots the peer pre-posted for us; each SEND spends a credit, and the
 * receiver returns credits by RDMA-writing how many slots it re-posted into a
 * word of ours (so credits never need a receive slot of their own). The user's
 * bytes are copied into a registered bounce slot, so an eager send completes
 * at once.
 * Rendezvous: larger messages announce themselves (RTS); the receiver, once a
 * matching receive is posted, registers its buffer and answers where to write
 * (CTS); the sender RDMA-WRITEs the payload and ends with WRITE_WITH_IMM, whose
 * immediate data names the receive, so the bytes land in place.
 * Send-queue accounting: every WR has a sequence number, one in SIGNAL_EVERY is
 * signalled (and every one whose completion a request waits for); a signalled
 * completion retires all earlier WRs of that QP, which frees bounce slots and
 * send-queue room.
 *
 * Registration of user memory: an HCA keeps the pages that were mapped when
 * a buffer was registered (pinned). Memory freed and mapped again at the same
 * address (glibc's free/malloc of large blocks: munmap, then mmap; a remap;
 * madvise DONTNEED) has new pages behind the same range, so a registration
 * kept across that moves bytes to and from pages nobody sees any more: wrong
 * results, silently. glibc's free calls munmap without going through the PLT,
 * so no hook on munmap can tell. Hence, by default:
 *  - the buffer of a rendezvous is registered for that message only (the
 *    user cannot free or remap it while the call is running), and
 *    deregistered when it completes;
 *  - where the HCA can (IBV_ACCESS_ON_DEMAND for RC send and write, LOOM_IB_ODP),
 *    user memory is registered on demand instead: the kernel follows changes
 *    of the mapping, so those registrations are cached;
 *  - memory the user registers through loom_comm_register_buffer (which
 *    promises it stays mapped until loom_comm_deregister_buffer), and Loom's
 *    own slots and credit words, stay registered.
 * LOOM_IB_REG_CACHE > 0 keeps idle pinned registrations too, for programs
 * that never free or remap a buffer they communicate from.
 *
 * With LOOM_AUTH_KEY both ends of the side channel prove the key (HMAC over
 * fresh nonces, as tcp.c) before a queue pair is brought up; the proofs cover
 * both records (QPN, PSN, LID, GID, rkey and address of the credit word) and
 * the addresses both ranks published, so a relay that rewrote an address in
 * the store, or a record changed on the way, fails the handshake. The RDMA
 * traffic itself is not sealed: the adapter moves it without the CPU.
 *
 * Liveness: the side-channel socket stays open. A goodbye on it tells a
 * peer that left on purpose from one that died (EOF without goodbye: PEER_LOST
 * at once), a gave-up note one whose communicator failed (a mismatch it found,
 * an abort) from both; a work request to a dead peer ends in a retry-exceeded
 * completion. Both notes count the messages their sender posted to us, since
 * the socket can overtake the queue pair: we judge what we still wait on once
 * that many have arrived, not after a guessed grace.
 * Like tcp.c, any failure is sticky for the instance and the requests that
 * were pending are never touched again.
 *
 * Files: ib_int.h (the instance, peer and request records the others
 * share), ib_init.c (device and port choice, protection domain, credit words,
 * listener; the loom-info listing), ib_connect.c (queue pairs, slots and the
 * side-channel handshake), ib_datapath.c (eager and rendezvous sends,
 * matching, completions, progress, user registrations), ib_teardown.c (the
 * failure announcement, abort, destroy); this file holds the ops table.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ib_int.h"
#include "ibverbs.h"
#include "transports/transport.h"
#include "base/log.h"

/* Every peer that found an active port too: it published an address. */
static int ib_reaches(loom_tp_t *tp, int peer, const char *peer_addr, int same_host)
{
    return peer_addr != NULL;
}

/* nvidia-peermem (or the older nv_peer_mem) lets ibv_reg_mr pin GPU memory. */
static int peermem_loaded(void)
{
    return access("/sys/module/nvidia_peermem", F_OK) == 0 ||
           access("/sys/module/nv_peer_mem", F_OK) == 0;
}

/* The PCIe distance between this thread's GPU and our HCA, as NCCL measures
 * it: both sysfs device paths (realpath of /sys/bus/pci/devices/<GPU bus id>
 * and of /sys/class/infiniband/<dev>/device), compared by loom_gdr_pci_near.
 * -1 (unknown) where either has none: no sysfs, a virtual device, a test
 * double. */
static int gpu_hca_near(loom_tp_t *tp, char *what, size_t whatlen)
{
    char id[64], link[PATH_MAX], gpu[PATH_MAX], hca[PATH_MAX];
    if (!tp->devmem || !tp->devmem->pci_bus_id || tp->devmem->pci_bus_id(id, sizeof(id)) != 0) {
        snprintf(what, whatlen, "the GPU's PCI bus id is unknown");
        return -1;
    }
    /* CUDA writes hex in capitals and may give an 8-digit domain; sysfs has
     * lower case and 4 digits. */
    for (char *c = id; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    const char *bdf = id;
    if (strlen(id) == 16 && strncmp(id, "0000", 4) == 0)
        bdf = id + 4;
    snprintf(link, sizeof(link), "/sys/bus/pci/devices/%s", bdf);
    const char *g = realpath(link, gpu) ? gpu : NULL;
    snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", tp->dev_name);
    const char *h = realpath(link, hca) ? hca : NULL;
    if (!g || !h) {
        snprintf(what, whatlen, "%s %s has no PCI device in sysfs", g ? "HCA" : "GPU",
                 g ? tp->dev_name : bdf);
        return -1;
    }
    return loom_gdr_pci_near(g, h, what, whatlen);
}

/* GPUDirect RDMA, decided at the first GPU buffer (never for a CPU-only
 * program, which must not start CUDA) and the same for every peer: the
 * registration is local, the peer only sees an address and an rkey. */
static int ib_device_memory(loom_tp_t *tp, int peer, char *why, size_t whylen)
{
    (void)peer;
    if (tp->gdr_path < 0) {
        /* Unset LOOM_NET_GDR goes direct only when GPU and HCA share a PCIe
         * switch; LOOM_NET_GDR=1 whatever the distance. */
        char distance[300];
        int near = tp->gdr_net < 0 ? gpu_hca_near(tp, distance, sizeof(distance)) : -1;
        loom_gdr_caps_t caps = {.forced = tp->gdr_net, .device_buffer = 1, .near = near,
                                .distance = tp->gdr_net < 0 ? distance : NULL};
        caps.verbs_dmabuf = tp->api->reg_dmabuf_mr != NULL;
        caps.gpu_dmabuf = tp->devmem && tp->devmem->dmabuf_supported && tp->devmem->dmabuf_export &&
                          tp->devmem->dmabuf_supported(NULL);
        caps.peermem = peermem_loaded();
        tp->gdr_path = (int)loom_gdr_decide(&caps, tp->gdr_why, sizeof(tp->gdr_why));
        LOOM_INFO("ibverbs", "rank %d: GPU buffers on %s: %s (%s)", tp->rank, tp->dev_name,
                  loom_gdr_path_name((loom_gdr_path_t)tp->gdr_path), tp->gdr_why);
    }
    if (why && whylen)
        snprintf(why, whylen, "ibverbs on %s: %s", tp->dev_name, tp->gdr_why);
    return tp->gdr_path == LOOM_GDR_DMABUF || tp->gdr_path == LOOM_GDR_PEERMEM ? 1
           : tp->gdr_path == LOOM_GDR_IMPOSSIBLE                               ? -1
                                                                               : 0;
}

static void ib_describe(FILE *out)
{
    fprintf(out, "#   libibverbs.so.1 is loaded at run time; the devices it sees:\n");
    fflush(out);
    loom_ibverbs_list_devices(out);
    /* What GPUDirect RDMA could use here, without starting CUDA: the GPU's
     * side (dma-buf export) is known only at the first GPU buffer. */
    const loom_ib_api_t *api = loom_ib_api_load(NULL, 0);
    int peermem = peermem_loaded();
    fprintf(out, "#   GPUDirect RDMA (LOOM_NET_GDR): ibv_reg_dmabuf_mr %s, nvidia-peermem %s\n",
            api && api->reg_dmabuf_mr ? "available" : "missing", peermem ? "loaded" : "not loaded");
}

const loom_transport_ops_t loom_ibverbs_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "ibverbs",
    .medium = "InfiniBand/RoCE",
    .create = ib_create,
    .connect = ib_connect,
    .isend = ib_isend,
    .irecv = ib_irecv,
    .probe = ib_probe,
    .progress = ib_progress,
    .mem_register = ib_mem_register,
    .mem_deregister = ib_mem_deregister,
    .abort = ib_abort,
    .destroy = ib_destroy,
    .reaches = ib_reaches,
    .describe = ib_describe,
    .device_memory = ib_device_memory,
};
