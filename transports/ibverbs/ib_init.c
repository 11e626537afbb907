/*
 * ib_init.c - create: the device and port, the protection domain, the credit
 * words and the side channel's listener; the device listing of loom-info.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ib_int.h"
#include "ibverbs.h"
#include "base/log.h"
#include "base/settings.h"
#include "transports/tp_handshake.h"

/* ---- registration cache callbacks ------------------------------------------ */

static int rc_reg(void *arg, void *addr, size_t len, void **mr_p, uint32_t *lkey, uint32_t *rkey)
{
    loom_tp_t *tp = arg;
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr = NULL;
    if (tp->odp && !tp->reg_pinned) {
        mr = tp->api->reg_mr(tp->pd, addr, len, access | IBV_ACCESS_ON_DEMAND);
        if (!mr) {
            /* The device said yes and the driver no (a kernel without ODP for
             * this MR type): pin from now on, and keep nothing pinned idle
             * beyond what LOOM_IB_REG_CACHE allows. */
            LOOM_WARN("ibverbs", "rank %d: on-demand registration on %s failed (%s); pinning "
                      "instead", tp->rank, tp->dev_name, strerror(errno));
            tp->odp = 0;
            tp->rcache.max_bytes = tp->pinned_cache;
        }
    }
    if (!mr)
        mr = tp->api->reg_mr(tp->pd, addr, len, access);
    if (!mr)
        return -1;
    *mr_p = mr;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

/* GPU memory: a dma-buf of the range, or the device pointer itself where
 * nvidia-peermem lets ibv_reg_mr pin GPU pages. Cached only under the
 * allocation's identity (ib_datapath.c, reg_get): the allocation may be freed
 * once the message is done. */
static int dc_reg(void *arg, void *addr, size_t len, void **mr_p, uint32_t *lkey, uint32_t *rkey)
{
    loom_tp_t *tp = arg;
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr = NULL;
    if (tp->gdr_path == LOOM_GDR_DMABUF) {
        int fd = -1;
        uint64_t off = 0;
        if (tp->devmem->dmabuf_export(addr, len, &fd, &off) != 0)
            return -1;
        mr = tp->api->reg_dmabuf_mr(tp->pd, off, len, (uintptr_t)addr, fd, access);
        int e = errno;
        close(fd);   /* the registration holds the dma-buf */
        errno = e;
    } else if (tp->gdr_path == LOOM_GDR_PEERMEM) {
        mr = tp->api->reg_mr(tp->pd, addr, len, access);
    } else {
        errno = EINVAL;
    }
    if (!mr)
        return -1;
    *mr_p = mr;
    *lkey = mr->lkey;
    *rkey = mr->rkey;
    return 0;
}

static void rc_dereg(void *arg, void *mr)
{
    loom_tp_t *tp = arg;
    tp->api->dereg_mr(mr);
}

/* ---- addresses ------------------------------------------------------------- */

/* "ibv1 HOST PORT ..." -> a socket address of the side channel. */
int ib_parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[INET6_ADDRSTRLEN + 1], port[16];
    if (sscanf(text, "ibv1 %46s %15s", host, port) != 2)
        return -1;
    return loom_tp_numeric_addr(host, port, ss, len);
}

/* The 16-byte form of a numeric host (IPv4-mapped for IPv4), for GID choice. */
static int host_to_gid(const char *host, uint8_t out[16])
{
    struct in_addr a4;
    if (inet_pton(AF_INET, host, &a4) == 1) {
        memset(out, 0, 10);
        out[10] = out[11] = 0xff;
        memcpy(out + 12, &a4, 4);
        return 0;
    }
    return inet_pton(AF_INET6, host, out) == 1 ? 0 : -1;
}

/* RoCE GID types from sysfs: 2 v2, 1 v1, 0 unknown (no sysfs, or a test provider). */
static int gid_type(const char *dev, int port, int index)
{
    char path[256], buf[32] = "";
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev,
             port, index);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    if (strstr(buf, "v2"))
        return 2;
    return buf[0] ? 1 : 0;
}

static int mtu_bytes(enum ibv_mtu m)
{
    return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0;
}

/* ---- create: device and port, protection domain, control region, listener -- */

typedef struct ib_cand {
    int dev;
    uint8_t port;
} ib_cand_t;

static loom_status_t open_port(loom_tp_t *tp, const loom_tp_params_t *p)
{
    char why[512];
    const loom_settings_t *cfg = p->settings;
    loom_ib_hca_list_t hcas;
    if (loom_ib_hca_parse(cfg ? cfg->ib_hca : NULL, &hcas, why, sizeof(why)) != 0)
        return loom_err_set(p->err, LOOM_ERR_INVALID_ARG, "%s", why);
    int ndev = 0;
    struct ibv_device **devs = tp->api->get_device_list(&ndev);
    if (!devs || ndev == 0) {
        int e = errno;
        if (devs)
            tp->api->free_device_list(devs);
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED, "ibverbs: no RDMA devices%s%s%s",
                            devs ? "" : " (ibv_get_device_list: ", devs ? "" : strerror(e),
                            devs ? "" : ")");
    }
    ib_cand_t cands[64];
    int ncand = 0, nports = 0;
    for (int d = 0; d < ndev && ncand < 64; d++) {
        const char *name = tp->api->get_device_name(devs[d]);
        struct ibv_context *ctx = tp->api->open_device(devs[d]);
        struct ibv_device_attr da;
        if (!ctx)
            continue;
        if (tp->api->query_device(ctx, &da) == 0) {
            for (int port = 1; port <= da.phys_port_cnt && ncand < 64; port++) {
                struct ibv_port_attr pa;
                memset(&pa, 0, sizeof(pa));
                if (tp->api->query_port(ctx, (uint8_t)port, &pa) != 0)
                    continue;
                nports++;
                if (pa.state == IBV_PORT_ACTIVE && loom_ib_hca_match(&hcas, name, port))
                    cands[ncand++] = (ib_cand_t){d, (uint8_t)port};
            }
        }
        tp->api->close_device(ctx);
    }
    if (ncand == 0) {
        tp->api->free_device_list(devs);
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED,
                            "ibverbs: no active RDMA port%s%s (%d device(s), %d port(s))",
                            cfg && cfg->ib_hca[0] ? " matches LOOM_IB_HCA=" : "",
                            cfg && cfg->ib_hca[0] ? cfg->ib_hca : "", ndev, nports);
    }
    /* Ranks of a node spread over the ports (one rail each); every rank of the
     * job must sit on the same fabric type. */
    ib_cand_t c = cands[p->rank % ncand];
    snprintf(tp->dev_name, sizeof(tp->dev_name), "%s", tp->api->get_device_name(devs[c.dev]));
    tp->port = c.port;
    tp->ctx = tp->api->open_device(devs[c.dev]);
    tp->api->free_device_list(devs);
    if (!tp->ctx)
        return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: cannot open %s: %s",
                            tp->dev_name, strerror(errno));
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    if (tp->api->query_port(tp->ctx, tp->port, &pa) != 0)
        return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_query_port %s:%d: %s",
                            tp->dev_name, tp->port, strerror(errno));
    tp->link_layer = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                              : IBV_LINK_LAYER_INFINIBAND;
    tp->mtu = pa.active_mtu;
    tp->lid = pa.lid;
    tp->gid_index = 0;
    int forced = cfg ? cfg->ib_gid_index : -1;
    if (tp->link_layer == IBV_LINK_LAYER_ETHERNET) {
        int n = pa.gid_tbl_len > 0 ? pa.gid_tbl_len : 1;
        if (n > 256)
            n = 256;
        uint8_t (*gids)[16] = calloc((size_t)n, 16);
        int *types = calloc((size_t)n, sizeof(int));
        if (!gids || !types) {
            free(gids);
            free(types);
            return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        }
        for (int i = 0; i < n; i++) {
            union ibv_gid g;
            if (tp->api->query_gid(tp->ctx, tp->port, i, &g) == 0)
                memcpy(gids[i], g.raw, 16);
            types[i] = gid_type(tp->dev_name, tp->port, i);
        }
        uint8_t pref[16];
        int have_pref = p->bind_host && *p->bind_host && host_to_gid(p->bind_host, pref) == 0;
        tp->gid_index = loom_ib_choose_gid((const uint8_t (*)[16])gids, types, n, forced,
                                           have_pref ? pref : NULL, why, sizeof(why));
        if (tp->gid_index >= 0)
            memcpy(tp->gid, gids[tp->gid_index], 16);
        free(gids);
        free(types);
        if (tp->gid_index < 0)
            return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: %s:%d: %s", tp->dev_name,
                                tp->port, why);
    } else {
        if (forced >= 0)
            tp->gid_index = forced;
        union ibv_gid g;
        if (tp->api->query_gid(tp->ctx, tp->port, tp->gid_index, &g) == 0)
            memcpy(tp->gid, g.raw, 16);
    }
    return LOOM_SUCCESS;
}

/* Whether the HCA serves RC sends and writes from and into on-demand-paged
 * memory. ibv_query_device_ex is an inline of verbs.h that would link
 * ibv_query_device; the provider's entry is called the same way instead. */
static int odp_supported(loom_tp_t *tp)
{
    struct verbs_context *vctx = verbs_get_ctx_op(tp->ctx, query_device_ex);
    if (!vctx)
        return 0;
    struct ibv_device_attr_ex ax;
    memset(&ax, 0, sizeof(ax));
    if (vctx->query_device_ex(tp->ctx, NULL, &ax, sizeof(ax)) != 0)
        return 0;
    const uint32_t want = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE;
    return (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
           (ax.odp_caps.per_transport_caps.rc_odp_caps & want) == want;
}

loom_status_t ib_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                        loom_tp_t **tp_p)
{
    char why[512];
    const loom_ib_api_t *api = loom_ib_api_load(why, sizeof(why));
    if (!api)
        return loom_err_set(p->err, LOOM_ERR_UNSUPPORTED, "ibverbs: %s", why);
    loom_status_t st;
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->api = api;
    tp->rank = p->rank;
    tp->size = p->size;
    tp->job_hash = p->job_hash;
    tp->comm_hash = p->comm_hash;
    tp->timeout_s = p->settings ? p->settings->timeout_s : 300;
    tp->qp_timeout = 20;
    tp->qp_retry_cnt = 7;
    tp->qp_rnr_retry = 7;
    if (p->settings) {
        tp->tc = (uint8_t)p->settings->ib_tc;
        tp->sl = (uint8_t)p->settings->ib_sl;
        tp->pinned_cache = p->settings->ib_reg_cache;
        tp->qp_timeout = (uint8_t)p->settings->ib_timeout;
        tp->qp_retry_cnt = (uint8_t)p->settings->ib_retry_cnt;
        tp->qp_rnr_retry = (uint8_t)p->settings->ib_rnr_retry;
    }
    if (p->settings && p->settings->auth_keylen > 0) {
        tp->auth_key = p->settings->auth_key;
        tp->auth_keylen = p->settings->auth_keylen;
    }
    tp->err = p->err;
    tp->listen_fd = tp->wake_fd = -1;
    tp->rdv_send.free_head = tp->rdv_recv.free_head = -1;
    tp->peers = calloc((size_t)p->size, sizeof(ib_peer_t));
    if (!tp->peers) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_free_tp;
    }
    for (int i = 0; i < p->size; i++) {
        tp->peers[i].rank = i;
        tp->peers[i].fd = -1;
    }
    if ((st = open_port(tp, p)) != LOOM_SUCCESS)
        goto err_close_dev;
    if (!(tp->pd = api->alloc_pd(tp->ctx))) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_alloc_pd on %s: %s",
                          tp->dev_name, strerror(errno));
        goto err_close_dev;
    }
    /* Credit words: one written by each peer, one we write from per peer. */
    tp->ctrl_bytes = ((size_t)p->size * 2 * sizeof(uint64_t) + 4095) & ~(size_t)4095;
    if (posix_memalign(&tp->ctrl_mem, 4096, tp->ctrl_bytes) != 0) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_dealloc_pd;
    }
    memset(tp->ctrl_mem, 0, tp->ctrl_bytes);
    tp->ctrl.credit_in = (volatile uint64_t *)tp->ctrl_mem;
    tp->ctrl.credit_src = (uint64_t *)tp->ctrl_mem + p->size;
    tp->ctrl_mr = api->reg_mr(tp->pd, tp->ctrl_mem, tp->ctrl_bytes,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!tp->ctrl_mr) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "ibverbs: ibv_reg_mr of %zu bytes: %s",
                          tp->ctrl_bytes, strerror(errno));
        goto err_free_ctrl;
    }
    tp->odp = (!p->settings || p->settings->ib_odp) && odp_supported(tp);
    loom_rcache_init(&tp->rcache, tp->odp ? ODP_CACHE_BYTES : tp->pinned_cache, 256, rc_reg,
                     rc_dereg, tp);
    loom_rcache_init(&tp->dcache, GDR_CACHE_BYTES, GDR_CACHE_ENTRIES, dc_reg, rc_dereg, tp);
    tp->devmem = p->devmem;
    tp->gdr_net = p->settings ? p->settings->net_gdr : -1;
    tp->gdr_path = -1;
    LOOM_INFO("ibverbs", "rank %d: user memory is %s", tp->rank,
              tp->odp ? "registered on demand (ODP) and cached"
                      : tp->pinned_cache ? "pinned and cached (LOOM_IB_REG_CACHE: stale if freed)"
                                         : "pinned per message, unless registered by the user");

    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if ((st = loom_tp_choose_host(p, host, sizeof(host))) != LOOM_SUCCESS)
        goto err_dereg_ctrl;
    /* The side channel's record carries a bare address (GID choice reads it too). */
    host[strcspn(host, "%")] = '\0';
    struct sockaddr_storage ss;
    socklen_t sslen;
    st = loom_hs_listen(host, 0, &tp->listen_fd, &ss, &sslen, p->err, "ibverbs: ");
    if (st != LOOM_SUCCESS)
        goto err_dereg_ctrl;
    int lport = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                              : ((struct sockaddr_in6 *)&ss)->sin6_port);
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "eventfd: %s", strerror(errno));
        goto err_close_listen;
    }
    char gidtxt[40];
    loom_ib_gid_format(tp->gid, gidtxt);
    /* The side channel first (peers parse it); the rest is for the logs. */
    if (snprintf(addr, addrlen, "ibv1 %s %d %s:%d %s lid=%u gid[%d]=%s mtu=%d", host, lport,
                 tp->dev_name, tp->port,
                 tp->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", tp->lid,
                 tp->gid_index, gidtxt, mtu_bytes(tp->mtu)) >= (int)addrlen) {
        st = loom_err_set(p->err, LOOM_ERR_INTERNAL, "address buffer too small");
        goto err_close_wake;
    }
    LOOM_INFO("ibverbs", "rank %d: %s", tp->rank, addr);
    snprintf(tp->my_addr, sizeof(tp->my_addr), "%s", addr);
    *tp_p = tp;
    return LOOM_SUCCESS;

err_close_wake:
    close(tp->wake_fd);
err_close_listen:
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
err_dereg_ctrl:
    api->dereg_mr(tp->ctrl_mr);
err_free_ctrl:
    free(tp->ctrl_mem);
err_dealloc_pd:
    api->dealloc_pd(tp->pd);
err_close_dev:
    if (tp->ctx)
        api->close_device(tp->ctx);
    free(tp->peers);
err_free_tp:
    free(tp);
    return st;
}

/* ---- loom-info ------------------------------------------------------------- */

static const char *port_state_name(enum ibv_port_state s)
{
    switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "NOP";
    }
}

int loom_ibverbs_list_devices(FILE *out)
{
    char why[512];
    const loom_ib_api_t *api = loom_ib_api_load(why, sizeof(why));
    if (!api) {
        fprintf(out, "#   no RDMA devices (%s)\n", why);
        return 0;
    }
    int ndev = 0;
    struct ibv_device **devs = api->get_device_list(&ndev);
    if (!devs || ndev == 0) {
        fprintf(out, "#   no RDMA devices%s%s%s\n", devs ? "" : " (ibv_get_device_list: ",
                devs ? "" : strerror(errno), devs ? "" : ")");
        if (devs)
            api->free_device_list(devs);
        return 0;
    }
    fprintf(out, "#   %d device(s)\n", ndev);
    for (int d = 0; d < ndev; d++) {
        const char *name = api->get_device_name(devs[d]);
        struct ibv_context *ctx = api->open_device(devs[d]);
        unsigned long long guid = (unsigned long long)be64toh(api->get_device_guid(devs[d]));
        struct ibv_device_attr da;
        if (!ctx || api->query_device(ctx, &da) != 0) {
            fprintf(out, "#     %s: cannot open: %s\n", name, strerror(errno));
            if (ctx)
                api->close_device(ctx);
            continue;
        }
        fprintf(out, "#     %s  guid %016llx  %d port(s)\n", name, guid, da.phys_port_cnt);
        for (int port = 1; port <= da.phys_port_cnt; port++) {
            struct ibv_port_attr pa;
            memset(&pa, 0, sizeof(pa));
            if (api->query_port(ctx, (uint8_t)port, &pa) != 0)
                continue;
            int roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
            fprintf(out, "#       port %d: %s, %s, lid %u, MTU %d (max %d)\n", port,
                    port_state_name(pa.state), roce ? "Ethernet (RoCE)" : "InfiniBand", pa.lid,
                    mtu_bytes(pa.active_mtu), mtu_bytes(pa.max_mtu));
            int n = pa.gid_tbl_len < 256 ? pa.gid_tbl_len : 256;
            for (int i = 0; i < n; i++) {
                union ibv_gid g;
                if (api->query_gid(ctx, (uint8_t)port, i, &g) != 0 || loom_ib_gid_is_zero(g.raw))
                    continue;
                char txt[40];
                loom_ib_gid_format(g.raw, txt);
                int type = gid_type(name, port, i);
                fprintf(out, "#         gid[%d] %s%s\n", i, txt,
                        type == 2 ? "  RoCE v2" : type == 1 ? (roce ? "  RoCE v1" : "  IB") : "");
            }
        }
        api->close_device(ctx);
    }
    api->free_device_list(devs);
    return ndev;
}
