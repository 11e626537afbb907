/*
 * The verbs test double's own test. Linked against the real libibverbs (Debian's headers
 * and link library) and run with LD_LIBRARY_PATH at the double, as the transport's tests
 * run it; tests/test_verbs_provider.sh sets that up. Each case runs in one or two forked
 * processes (the parent never calls verbs) that use the verbs API as a user would; two
 * processes talk over a socketpair to swap QP addresses.
 */
#include <infiniband/verbs.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int role;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "  %s:%d: role %d: %s failed (errno %d)\n", __FILE__, __LINE__, role,  \
                    #c, errno);                                                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

struct addr {
    uint32_t qpn;
    uint16_t lid;
    union ibv_gid gid;
    uint64_t va;
    uint32_t rkey;
};

struct ep {
    struct ibv_device **list;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_port_attr port;
    int gid_index;
};

static int ep_open(struct ep *e, int cqe, uint32_t swr, uint32_t rwr)
{
    memset(e, 0, sizeof(*e));
    e->list = ibv_get_device_list(NULL);
    CHECK(e->list && e->list[0]);
    CHECK((e->ctx = ibv_open_device(e->list[0])) != NULL);
    CHECK(ibv_query_port(e->ctx, 1, &e->port) == 0);
    e->gid_index = e->port.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0;
    CHECK((e->pd = ibv_alloc_pd(e->ctx)) != NULL);
    CHECK((e->cq = ibv_create_cq(e->ctx, cqe, NULL, NULL, 0)) != NULL);
    struct ibv_qp_init_attr ia = {.send_cq = e->cq,
                                  .recv_cq = e->cq,
                                  .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = swr,
                                          .max_recv_wr = rwr,
                                          .max_send_sge = 2,
                                          .max_recv_sge = 2,
                                          .max_inline_data = 64}};
    CHECK((e->qp = ibv_create_qp(e->pd, &ia)) != NULL);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT,
                            .port_num = 1,
                            .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE};
    CHECK(ibv_modify_qp(e->qp, &a,
                        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    return 0;
}

static struct addr ep_addr(struct ep *e, void *va, uint32_t rkey)
{
    struct addr a = {.qpn = e->qp->qp_num, .lid = e->port.lid, .va = (uintptr_t)va, .rkey = rkey};
    ibv_query_gid(e->ctx, 1, e->gid_index, &a.gid);
    return a;
}

static int ep_rtr_rts(struct ep *e, const struct addr *peer)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                            .path_mtu = IBV_MTU_4096,
                            .dest_qp_num = peer->qpn,
                            .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12,
                            .ah_attr = {.dlid = peer->lid, .port_num = 1}};
    if (e->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = peer->gid;
        a.ah_attr.grh.sgid_index = (uint8_t)e->gid_index;
        a.ah_attr.grh.hop_limit = 1;
    }
    CHECK(ibv_modify_qp(e->qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
    struct ibv_qp_attr b = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    CHECK(ibv_modify_qp(e->qp, &b,
                        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
    return 0;
}

static void sync_point(int fd)
{
    char c = 0;
    if (write(fd, &c, 1) != 1 || read(fd, &c, 1) != 1)
        _exit(3);
}

/* Swap addresses with the other process and connect; *peer gets its address. Both sides
 * are in RTS on return: a WR that reaches a responder still in RTR may fail it (as on an
 * HCA), and its own move to RTS would then fail. */
static int ep_connect(struct ep *e, int fd, void *va, uint32_t rkey, struct addr *peer)
{
    struct addr mine = ep_addr(e, va, rkey);
    CHECK(write(fd, &mine, sizeof(mine)) == sizeof(mine));
    CHECK(read(fd, peer, sizeof(*peer)) == sizeof(*peer));
    if (ep_rtr_rts(e, peer))
        return 1;
    sync_point(fd);
    return 0;
}

static void ep_close(struct ep *e)
{
    if (e->qp)
        ibv_destroy_qp(e->qp);
    if (e->cq)
        ibv_destroy_cq(e->cq);
    if (e->pd)
        ibv_dealloc_pd(e->pd);
    if (e->ctx)
        ibv_close_device(e->ctx);
    if (e->list)
        ibv_free_device_list(e->list);
}

/* One completion within ms: 1, or 0 on timeout, or poll_cq's negative value. */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
    double end = now_ms() + ms;
    do {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n)
            return n;
        usleep(200);
    } while (now_ms() < end);
    return 0;
}

static int post_recv(struct ibv_qp *qp, uint64_t id, void *buf, uint32_t len, uint32_t lkey)
{
    struct ibv_sge sge = {(uintptr_t)buf, len, lkey};
    struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = buf ? 1 : 0}, *bad;
    return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct ibv_qp *qp, uint64_t id, enum ibv_wr_opcode op, unsigned flags,
                     void *buf, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                     uint32_t imm)
{
    struct ibv_sge sge = {(uintptr_t)buf, len, lkey};
    struct ibv_send_wr wr = {.wr_id = id,
                             .sg_list = &sge,
                             .num_sge = buf ? 1 : 0,
                             .opcode = op,
                             .send_flags = flags,
                             .imm_data = imm},
                       *bad;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
}

/* ---- cases -------------------------------------------------------------------------------- */

/* FAKEVERBS_DEVICES / FAKEVERBS_LINK_LAYER as loom-info would list them. */
static int t_listing_roce(int fd)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 2 && list[2] == NULL);
    CHECK(!strcmp(ibv_get_device_name(list[0]), "loomfake0") &&
          !strcmp(ibv_get_device_name(list[1]), "loomfake1"));
    CHECK(ibv_get_device_guid(list[0]) != 0 &&
          ibv_get_device_guid(list[0]) != ibv_get_device_guid(list[1]));
    struct ibv_context *ctx = ibv_open_device(list[1]);
    CHECK(ctx);
    struct ibv_device_attr da;
    CHECK(ibv_query_device(ctx, &da) == 0 && da.phys_port_cnt == 2 && da.max_qp_wr > 0);
    struct ibv_port_attr pa;
    CHECK(ibv_query_port(ctx, 2, &pa) == 0);
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.active_mtu == IBV_MTU_4096 &&
          pa.link_layer == IBV_LINK_LAYER_ETHERNET);
    CHECK(pa.gid_tbl_len == 2 && pa.lid == 0);
    CHECK(ibv_query_port(ctx, 3, &pa) != 0);
    union ibv_gid g0, g1, g2;
    static const uint8_t v4[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    CHECK(ibv_query_gid(ctx, 2, 0, &g0) == 0 && g0.raw[0] == 0xfe && g0.raw[1] == 0x80);
    CHECK(ibv_query_gid(ctx, 2, 1, &g1) == 0 && !memcmp(g1.raw, v4, 16));
    CHECK(ibv_query_gid(ctx, 2, 2, &g2) != 0);
    CHECK(!strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active"));
    /* Not an extended context: the ex inlines answer "not supported". */
    struct ibv_cq_init_attr_ex cqa = {.cqe = 4};
    CHECK(ibv_create_cq_ex(ctx, &cqa) == NULL);
    CHECK(ibv_close_device(ctx) == 0);
    ibv_free_device_list(list);
    return 0;
}

static int t_listing_ib(int fd)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1 && !strcmp(list[0]->name, "loomfake0"));
    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx);
    struct ibv_port_attr pa;
    CHECK(ibv_query_port(ctx, 1, &pa) == 0);
    CHECK(pa.link_layer == IBV_LINK_LAYER_INFINIBAND && pa.lid != 0 && pa.gid_tbl_len == 1);
    CHECK(!strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error"));
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd);
    char buf[64];
    /* dma-buf: a memfd stands in (no CUDA double here: its offset 0 is the fd's). */
    int dfd = memfd_create("fv-dmabuf", MFD_CLOEXEC);
    CHECK(dfd >= 0 && ftruncate(dfd, 8192) == 0);
    CHECK(ibv_reg_dmabuf_mr(pd, 0, 8193, 0x100000, dfd, IBV_ACCESS_LOCAL_WRITE) == NULL &&
          errno == EINVAL);   /* past its end */
    CHECK(ibv_reg_dmabuf_mr(pd, 0, 64, 0x100000, dfd, IBV_ACCESS_REMOTE_WRITE) == NULL &&
          errno == EINVAL);   /* remote write without local write */
    struct ibv_mr *dmr = ibv_reg_dmabuf_mr(pd, 4096, 4096, 0x100000, dfd,
                                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(dmr && dmr->lkey && dmr->length == 4096 && ibv_dereg_mr(dmr) == 0);
    setenv("FAKEVERBS_DMABUF", "0", 1);
    CHECK(ibv_reg_dmabuf_mr(pd, 0, 64, 0x100000, dfd, IBV_ACCESS_LOCAL_WRITE) == NULL &&
          errno == EOPNOTSUPP);
    unsetenv("FAKEVERBS_DMABUF");
    close(dfd);
    CHECK(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE) == NULL);
    CHECK(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
    CHECK(ibv_reg_mr(pd, (void *)16, 64, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT);
    CHECK(ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0);
    ibv_free_device_list(list);
    return 0;
}

static int t_no_devices(int fd)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 0 && list[0] == NULL);
    ibv_free_device_list(list);
    return 0;
}

/* The modify_qp state machine and its attribute masks, in one process. */
static int t_modify_masks(int fd)
{
    struct ep e;
    memset(&e, 0, sizeof(e));
    CHECK((e.list = ibv_get_device_list(NULL)) && (e.ctx = ibv_open_device(e.list[0])));
    CHECK((e.pd = ibv_alloc_pd(e.ctx)) && (e.cq = ibv_create_cq(e.ctx, 16, NULL, NULL, 0)));
    struct ibv_qp_init_attr ia = {
        .send_cq = e.cq,
        .recv_cq = e.cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
    struct ibv_qp_init_attr bad = ia;
    bad.qp_type = IBV_QPT_UD;
    CHECK(ibv_create_qp(e.pd, &bad) == NULL);
    bad = ia;
    bad.cap.max_send_wr = 1 << 20;
    CHECK(ibv_create_qp(e.pd, &bad) == NULL && errno == EINVAL);
    CHECK((e.qp = ibv_create_qp(e.pd, &ia)) != NULL);
    CHECK(ibv_query_port(e.ctx, 1, &e.port) == 0);

    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    const int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    CHECK(ibv_modify_qp(e.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) ==
          EINVAL);
    CHECK(ibv_modify_qp(e.qp, &a, init | IBV_QP_SQ_PSN) == EINVAL);
    a.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(e.qp, &a, IBV_QP_STATE) == EINVAL); /* RESET -> ERR is not a transition */
    a.qp_state = IBV_QPS_RTR;
    CHECK(ibv_modify_qp(e.qp, &a, init) == EINVAL);
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 9;
    CHECK(ibv_modify_qp(e.qp, &a, init) == EINVAL);
    a.port_num = 1;
    CHECK(ibv_modify_qp(e.qp, &a, init) == 0 && e.qp->state == IBV_QPS_INIT);
    CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0, 0) == EINVAL);

    /* Connect to itself (loopback), testing each missing bit of INIT->RTR and RTR->RTS. */
    struct addr self = ep_addr(&e, NULL, 0);
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR,
                            .path_mtu = IBV_MTU_4096,
                            .dest_qp_num = self.qpn,
                            .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12,
                            .ah_attr = {.dlid = self.lid, .port_num = 1}};
    const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    for (int bit = 1; bit < rtr; bit <<= 1)
        if ((rtr & bit) && bit != IBV_QP_STATE)
            CHECK(ibv_modify_qp(e.qp, &r, rtr & ~bit) == EINVAL);
    CHECK(ibv_modify_qp(e.qp, &r, rtr | IBV_QP_TIMEOUT) == EINVAL);
    CHECK(ibv_modify_qp(e.qp, &r, rtr) == 0);
    struct ibv_qp_attr s = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    const int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                    IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    for (int bit = 1; bit < rts; bit <<= 1)
        if ((rts & bit) && bit != IBV_QP_STATE)
            CHECK(ibv_modify_qp(e.qp, &s, rts & ~bit) == EINVAL);
    CHECK(ibv_modify_qp(e.qp, &s, rts | IBV_QP_PATH_MTU) == EINVAL);
    CHECK(ibv_modify_qp(e.qp, &s, rts) == 0);
    struct ibv_qp_attr q;
    struct ibv_qp_init_attr qi;
    CHECK(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_RTS &&
          q.dest_qp_num == self.qpn);
    CHECK(qi.cap.max_send_wr == 4 && q.timeout == 14);
    s.min_rnr_timer = 5;
    CHECK(ibv_modify_qp(e.qp, &s, IBV_QP_MIN_RNR_TIMER) == 0); /* RTS -> RTS */
    CHECK(ibv_modify_qp(e.qp, &s, IBV_QP_TIMEOUT) == EINVAL);

    /* Loopback works: a send to itself. */
    char in[16] = {0}, out[16] = "loopback";
    struct ibv_mr *mr = ibv_reg_mr(e.pd, in, sizeof(in), IBV_ACCESS_LOCAL_WRITE);
    struct ibv_mr *mo = ibv_reg_mr(e.pd, out, sizeof(out), 0);
    CHECK(mr && mo);
    CHECK(post_recv(e.qp, 7, in, sizeof(in), mr->lkey) == 0);
    CHECK(post_send(e.qp, 8, IBV_WR_SEND, IBV_SEND_SIGNALED, out, 9, mo->lkey, 0, 0, 0) == 0);
    struct ibv_wc wc[2];
    int got = 0;
    for (double end = now_ms() + 10000; got < 2 && now_ms() < end;)
        got += poll1(e.cq, &wc[got], 100);
    CHECK(got == 2 && wc[0].status == IBV_WC_SUCCESS && wc[1].status == IBV_WC_SUCCESS);
    CHECK(!strcmp(in, "loopback"));

    /* To ERR, then RESET, then the whole way again is legal. */
    struct ibv_qp_attr st = {.qp_state = IBV_QPS_ERR};
    CHECK(ibv_modify_qp(e.qp, &st, IBV_QP_STATE | IBV_QP_CUR_STATE) == EINVAL);
    CHECK(ibv_modify_qp(e.qp, &st, IBV_QP_STATE) == 0);
    st.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(e.qp, &st, IBV_QP_STATE) == 0);
    CHECK(ibv_modify_qp(e.qp, &a, init) == 0);
    CHECK(ibv_destroy_cq(e.cq) == EBUSY);
    CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(mo) == 0);
    ep_close(&e);
    return 0;
}

/* RoCE: an address vector without a GRH is refused; with the GRH the pair talks. */
static int t_roce_grh(int fd)
{
    struct ep e;
    struct addr peer;
    char buf[32] = "roce";
    if (ep_open(&e, 16, 8, 8))
        return 1;
    struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr);
    struct addr mine = ep_addr(&e, buf, mr->rkey);
    CHECK(write(fd, &mine, sizeof(mine)) == sizeof(mine) &&
          read(fd, &peer, sizeof(peer)) == sizeof(peer));
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTR,
                            .path_mtu = IBV_MTU_1024,
                            .dest_qp_num = peer.qpn,
                            .max_dest_rd_atomic = 1,
                            .min_rnr_timer = 12,
                            .ah_attr = {.dlid = 1, .port_num = 1}};
    CHECK(ibv_modify_qp(e.qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ==
          EINVAL);
    if (ep_rtr_rts(&e, &peer))
        return 1;
    sync_point(fd);
    struct ibv_wc wc;
    if (role == 0) {
        CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE, buf, 5, 0, 0, 0,
                        0) == 0);
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.status == IBV_WC_SUCCESS);
    } else {
        memset(buf, 0, sizeof(buf));
        CHECK(post_recv(e.qp, 2, buf, sizeof(buf), mr->lkey) == 0);
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 5 &&
              !strcmp(buf, "roce"));
    }
    sync_point(fd);
    ibv_dereg_mr(mr);
    ep_close(&e);
    return 0;
}

/* SEND, inline SEND and SEND_WITH_IMM across processes; a SEND posted before the receive
 * waits for it (RNR), which also shows the WR runs after the post returned. */
static int t_send_recv(int fd)
{
    struct ep e;
    struct addr peer;
    char buf[2][64];
    struct ibv_wc wc;
    if (ep_open(&e, 16, 8, 8))
        return 1;
    struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr);
    if (ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 0) {
        strcpy(buf[0], "first message");
        strcpy(buf[1], "second");
        CHECK(post_send(e.qp, 1, IBV_WR_SEND, 0, buf[0], 14, mr->lkey, 0, 0, 0) == 0);
        CHECK(post_send(e.qp, 2, IBV_WR_SEND, IBV_SEND_INLINE, buf[1], 7, 0, 0, 0, 0) == 0);
        memset(buf[1], 'X', 7); /* inline data was taken at post time */
        CHECK(post_send(e.qp, 3, IBV_WR_SEND_WITH_IMM, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0,
                        htonl(0xabcd)) == 0);
        /* Unsignalled WRs give no completion; the signalled one does. */
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS &&
              wc.opcode == IBV_WC_SEND);
        CHECK(poll1(e.cq, &wc, 50) == 0);
        sync_point(fd); /* the peer posts its receive only after the next sync point */
        CHECK(post_send(e.qp, 4, IBV_WR_SEND, IBV_SEND_SIGNALED, buf[0], 14, mr->lkey, 0, 0, 0) ==
              0);
        /* The WR waits (RNR) and reads the buffer when it runs: the peer gets this text. */
        strcpy(buf[0], "changed after");
        sync_point(fd);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 4 && wc.status == IBV_WC_SUCCESS);
    } else {
        memset(buf, 0, sizeof(buf));
        CHECK(post_recv(e.qp, 10, buf[0], 32, mr->lkey) == 0);
        CHECK(post_recv(e.qp, 11, buf[1], 32, mr->lkey) == 0);
        CHECK(post_recv(e.qp, 12, NULL, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 10 && wc.status == IBV_WC_SUCCESS &&
              wc.byte_len == 14);
        CHECK(wc.opcode == IBV_WC_RECV && wc.src_qp == peer.qpn && wc.qp_num == e.qp->qp_num &&
              !strcmp(buf[0], "first message"));
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 11 && wc.byte_len == 7 &&
              !strcmp(buf[1], "second"));
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 12 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
              ntohl(wc.imm_data) == 0xabcd && wc.byte_len == 0);
        sync_point(fd);
        sync_point(fd);
        usleep(100 * 1000);
        memset(buf[0], 0, 32);
        CHECK(post_recv(e.qp, 13, buf[0], 32, mr->lkey) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 13 && wc.status == IBV_WC_SUCCESS &&
              !strcmp(buf[0], "changed after"));
    }
    sync_point(fd);
    CHECK(ibv_dereg_mr(mr) == 0);
    ep_close(&e);
    return 0;
}

/* RDMA WRITE of 4 MiB (two SGEs, unsignalled) then WRITE_WITH_IMM, which completes a
 * receive at the target with the immediate. */
static int t_rdma_write(int fd)
{
    const size_t n = 4 << 20;
    struct ep e;
    struct addr peer;
    struct ibv_wc wc;
    unsigned char *buf = malloc(n);
    CHECK(buf);
    if (ep_open(&e, 16, 8, 8))
        return 1;
    struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(mr);
    /* Before connecting: once connected the writer may write at any time. */
    for (size_t i = 0; i < n; i++)
        buf[i] = role == 0 ? (unsigned char)(i * 7 + 1) : 0;
    if (ep_connect(&e, fd, buf, mr->rkey, &peer))
        return 1;
    if (role == 0) {
        struct ibv_sge sg[2] = {{(uintptr_t)buf, (uint32_t)(n / 2), mr->lkey},
                                {(uintptr_t)buf + n / 2, (uint32_t)(n / 2 - 16), mr->lkey}};
        struct ibv_send_wr w = {.wr_id = 1,
                                .sg_list = sg,
                                .num_sge = 2,
                                .opcode = IBV_WR_RDMA_WRITE},
                           *bad;
        w.wr.rdma.remote_addr = peer.va;
        w.wr.rdma.rkey = peer.rkey;
        CHECK(ibv_post_send(e.qp, &w, &bad) == 0);
        CHECK(post_send(e.qp, 2, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, buf + n - 16, 16,
                        mr->lkey, peer.va + n - 16, peer.rkey, htonl(77)) == 0);
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_SUCCESS &&
              wc.opcode == IBV_WC_RDMA_WRITE);
        /* Zero length: only the immediate, no rkey needed. */
        CHECK(post_send(e.qp, 3, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0,
                        htonl(78)) == 0);
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_SUCCESS);
    } else {
        CHECK(post_recv(e.qp, 5, NULL, 0, 0) == 0 && post_recv(e.qp, 6, NULL, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.wr_id == 5 && wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(wc.imm_data) == 77 &&
              wc.byte_len == 16);
        for (size_t i = 0; i < n; i++)
            CHECK(buf[i] == (unsigned char)(i * 7 + 1));
        CHECK(poll1(e.cq, &wc, 30000) == 1 && wc.wr_id == 6 && wc.status == IBV_WC_SUCCESS);
        CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(wc.imm_data) == 78 &&
              wc.byte_len == 0);
    }
    sync_point(fd);
    ibv_dereg_mr(mr);
    ep_close(&e);
    free(buf);
    return 0;
}

/* Remote access errors: a wrong rkey, an MR without remote write, a range past the MR's end,
 * and FAKEVERBS_FAULT=rae@5 on role 0. Each fails the writer's QP and the responder's. */
static int t_remote_access(int fd)
{
    static char buf[4096];
    for (int k = 0; k < 4; k++) {
        struct ep e;
        struct addr peer;
        struct ibv_wc wc;
        if (ep_open(&e, 16, 8, 8))
            return 1;
        int access = IBV_ACCESS_LOCAL_WRITE | (k == 1 ? 0 : IBV_ACCESS_REMOTE_WRITE);
        struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, sizeof(buf), access);
        CHECK(mr);
        if (ep_connect(&e, fd, buf, mr->rkey, &peer))
            return 1;
        if (role == 1)
            CHECK(post_recv(e.qp, 20, buf, 16, mr->lkey) == 0);
        sync_point(fd);
        if (role == 0) {
            uint32_t rkey = peer.rkey + (k == 0 ? 1 : 0);
            uint64_t raddr = peer.va + (k == 2 ? 4000 : 0);
            if (k == 3) /* WRITEs 1-3 were k 0-2; this 4th one succeeds, rae@5 fails the 5th */
                CHECK(post_send(e.qp, 8, IBV_WR_RDMA_WRITE, 0, buf, 100, mr->lkey, raddr, rkey,
                                0) == 0);
            CHECK(post_send(e.qp, 9, IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, buf, 100, mr->lkey,
                            raddr, rkey, 0) == 0);
            CHECK(post_send(e.qp, 10, IBV_WR_SEND, IBV_SEND_SIGNALED, buf, 1, mr->lkey, 0, 0, 0) ==
                  0);
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 9 &&
                  wc.status == IBV_WC_REM_ACCESS_ERR);
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 10 &&
                  wc.status == IBV_WC_WR_FLUSH_ERR);
            CHECK(e.qp->state == IBV_QPS_ERR);
        } else {
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 20 &&
                  wc.status == IBV_WC_WR_FLUSH_ERR);
            struct ibv_qp_attr q;
            struct ibv_qp_init_attr qi;
            CHECK(ibv_query_qp(e.qp, &q, IBV_QP_STATE, &qi) == 0 && q.qp_state == IBV_QPS_ERR);
        }
        sync_point(fd);
        ibv_dereg_mr(mr);
        ep_close(&e);
    }
    return 0;
}

/* Local checks: a bad lkey, a receive too small; a wrong dlid never arrives. */
static int t_local_errors(int fd)
{
    static char buf[256];
    for (int k = 0; k < 3; k++) {
        struct ep e;
        struct addr peer;
        struct ibv_wc wc;
        if (ep_open(&e, 16, 8, 8))
            return 1;
        struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
        CHECK(mr);
        struct addr mine = ep_addr(&e, buf, mr->rkey);
        CHECK(write(fd, &mine, sizeof(mine)) == sizeof(mine) &&
              read(fd, &peer, sizeof(peer)) == sizeof(peer));
        if (k == 2 && role == 0)
            peer.lid++;
        if (ep_rtr_rts(&e, &peer))
            return 1;
        if (role == 1)
            CHECK(post_recv(e.qp, 2, buf, 10, mr->lkey) == 0);
        sync_point(fd);
        if (role == 0) {
            uint32_t lkey = k == 0 ? mr->lkey ^ 0x1000 : mr->lkey;
            double t0 = now_ms();
            CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, buf, 100, lkey, 0, 0, 0) == 0);
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 1);
            enum ibv_wc_status want[] = {IBV_WC_LOC_PROT_ERR, IBV_WC_REM_INV_REQ_ERR,
                                         IBV_WC_RETRY_EXC_ERR};
            CHECK(wc.status == want[k]);
            if (k == 2) /* FAKEVERBS_RETRY_MS=300 */
                CHECK(now_ms() - t0 >= 250);
        } else {
            if (k == 1)
                CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 2 &&
                      wc.status == IBV_WC_LOC_LEN_ERR);
        }
        sync_point(fd);
        ibv_dereg_mr(mr);
        ep_close(&e);
    }
    return 0;
}

/* A SEND that finds no receive fails with RNR_RETRY_EXC_ERR after FAKEVERBS_RNR_MS. */
static int t_rnr(int fd)
{
    struct ep e;
    struct addr peer;
    struct ibv_wc wc;
    if (ep_open(&e, 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 0) {
        double t0 = now_ms();
        CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.status == IBV_WC_RNR_RETRY_EXC_ERR);
        CHECK(now_ms() - t0 >= 250); /* FAKEVERBS_RNR_MS=300 */
    }
    sync_point(fd);
    ep_close(&e);
    return 0;
}

/* Queue depths: slots free when their CQEs are polled (an unsignalled send's only with a
 * later signalled one's); a full queue makes the post return ENOMEM and name the WR. */
static int t_queue_depth(int fd)
{
    struct ep e;
    struct addr peer;
    struct ibv_wc wc;
    static char buf[64];
    if (ep_open(&e, 16, 2, 2))
        return 1;
    struct ibv_mr *mr = ibv_reg_mr(e.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr);
    if (ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 1) {
        CHECK(post_recv(e.qp, 1, buf, 8, mr->lkey) == 0 &&
              post_recv(e.qp, 2, buf + 8, 8, mr->lkey) == 0);
        CHECK(post_recv(e.qp, 3, buf, 8, mr->lkey) == ENOMEM);
        struct ibv_sge sge = {(uintptr_t)buf, 8, mr->lkey};
        struct ibv_recv_wr w = {.wr_id = 4, .sg_list = &sge, .num_sge = 3}, *bad = NULL;
        CHECK(ibv_post_recv(e.qp, &w, &bad) == EINVAL &&
              bad == &w); /* more SGEs than max_recv_sge */
        sync_point(fd);
        /* Both messages landed; their CQEs are not polled yet, so the RQ is still full. */
        volatile char *v = buf;
        for (double end = now_ms() + 20000; (v[0] != 'a' || v[8] != 'a') && now_ms() < end;)
            usleep(1000);
        usleep(50 * 1000);
        CHECK(post_recv(e.qp, 3, buf, 8, mr->lkey) == ENOMEM);
        for (int i = 0; i < 2; i++)
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 4);
        CHECK(post_recv(e.qp, 5, buf, 8, mr->lkey) == 0 &&
              post_recv(e.qp, 6, buf, 8, mr->lkey) == 0);
        CHECK(post_recv(e.qp, 7, buf, 8, mr->lkey) == ENOMEM);
        sync_point(fd);
    } else {
        strcpy(buf, "abc");
        sync_point(fd);
        struct ibv_sge sge = {(uintptr_t)buf, 4, mr->lkey};
        struct ibv_send_wr w[3], *bad = NULL;
        for (int i = 0; i < 3; i++)
            w[i] = (struct ibv_send_wr){.wr_id = (uint64_t)i,
                                        .sg_list = &sge,
                                        .num_sge = 1,
                                        .opcode = IBV_WR_SEND,
                                        .next = i < 2 ? &w[i + 1] : NULL};
        CHECK(ibv_post_send(e.qp, &w[0], &bad) == ENOMEM && bad == &w[2]);
        /* Both ran (the peer polled them), yet with no signalled CQE polled the SQ stays full. */
        sync_point(fd);
        CHECK(post_send(e.qp, 9, IBV_WR_SEND, IBV_SEND_SIGNALED, buf, 4, mr->lkey, 0, 0, 0) ==
              ENOMEM);
        CHECK(poll1(e.cq, &wc, 100) == 0);
    }
    sync_point(fd);
    ibv_dereg_mr(mr);
    ep_close(&e);
    return 0;
}

/* A CQ of 2 entries receiving 3 completions overruns: poll_cq fails, the QP is in error. */
static int t_cq_overrun(int fd)
{
    struct ep e;
    struct addr peer;
    struct ibv_wc wc[4];
    if (ep_open(&e, role == 1 ? 2 : 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 1) {
        for (int i = 0; i < 3; i++)
            CHECK(post_recv(e.qp, (uint64_t)i, NULL, 0, 0) == 0);
        sync_point(fd);
        double end = now_ms() + 20000;
        int rc = 0;
        while (now_ms() < end &&
               (rc = ibv_poll_cq(e.cq, 0, wc)) == 0) /* polls nothing: 0 entries */
            usleep(1000);
        CHECK(rc < 0);
        CHECK(ibv_poll_cq(e.cq, 4, wc) < 0);
        CHECK(e.qp->state == IBV_QPS_ERR);
    } else {
        sync_point(fd);
        for (int i = 0; i < 3; i++)
            CHECK(post_send(e.qp, (uint64_t)i, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0,
                            0) == 0);
        for (int i = 0; i < 3; i++)
            CHECK(poll1(e.cq, wc, 20000) == 1 && wc[0].status == IBV_WC_SUCCESS);
    }
    sync_point(fd);
    ep_close(&e);
    return 0;
}

/* Flushes: modify to ERR flushes posted receives; FAKEVERBS_FAULT=qperr@5 on role 1 fails all
 * its QPs at its 5th WR, after which role 0's sends find no responder (RETRY_EXC_ERR). */
static int t_qp_error(int fd)
{
    struct ep e;
    struct addr peer;
    struct ibv_wc wc;
    if (ep_open(&e, 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 1) {
        for (int i = 0; i < 3; i++)
            CHECK(post_recv(e.qp, (uint64_t)i, NULL, 0, 0) == 0);
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
        CHECK(ibv_modify_qp(e.qp, &a, IBV_QP_STATE) == 0);
        for (int i = 0; i < 3; i++)
            CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == (uint64_t)i &&
                  wc.status == IBV_WC_WR_FLUSH_ERR);
        /* Posting to an ERR QP is accepted and flushed. */
        CHECK(post_recv(e.qp, 3, NULL, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 3 && wc.status == IBV_WC_WR_FLUSH_ERR);
        ep_close(&e);

        /* A second QP: the 5th WR of this process (4 so far) fires qperr@5. */
        if (ep_open(&e, 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
            return 1;
        CHECK(e.qp->state == IBV_QPS_RTS);
        CHECK(post_recv(e.qp, 4, NULL, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 4 && wc.status == IBV_WC_WR_FLUSH_ERR);
        CHECK(e.qp->state == IBV_QPS_ERR);
        sync_point(fd);
    } else {
        ep_close(&e);
        if (ep_open(&e, 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
            return 1;
        sync_point(fd);
        CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0, 0) == 0);
        CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.status == IBV_WC_RETRY_EXC_ERR);
    }
    sync_point(fd);
    ep_close(&e);
    return 0;
}

/* A peer that vanished (killed; a zombie until the parent reaps it) gives RETRY_EXC_ERR. */
static int t_dead_peer(int fd)
{
    struct ep e;
    struct addr peer;
    struct ibv_wc wc;
    if (ep_open(&e, 16, 8, 8) || ep_connect(&e, fd, NULL, 0, &peer))
        return 1;
    if (role == 1) {
        CHECK(post_recv(e.qp, 1, NULL, 0, 0) == 0);
        sync_point(fd);
        raise(SIGKILL);
    }
    sync_point(fd);
    char c;
    CHECK(read(fd, &c, 1) == 0); /* the peer is gone */
    double t0 = now_ms();
    CHECK(post_send(e.qp, 1, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0, 0) == 0);
    CHECK(post_send(e.qp, 2, IBV_WR_SEND, IBV_SEND_SIGNALED, NULL, 0, 0, 0, 0, 0) == 0);
    CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_RETRY_EXC_ERR);
    CHECK(poll1(e.cq, &wc, 20000) == 1 && wc.wr_id == 2 && wc.status == IBV_WC_WR_FLUSH_ERR);
    CHECK(now_ms() - t0 >= 250); /* FAKEVERBS_RETRY_MS=300 */
    ep_close(&e);
    return 0;
}

/* ---- the runner --------------------------------------------------------------------------- */

typedef int (*case_fn)(int fd);

static void apply_env(char *env)
{
    for (char *save = NULL, *kv = strtok_r(env, " ", &save); kv; kv = strtok_r(NULL, " ", &save))
        putenv(kv);
}

static pid_t spawn(int r, case_fn fn, int fd, int other_fd, const char *env)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (other_fd >= 0)
            close(other_fd); /* so that the peer's death reads as EOF */
        role = r;
        alarm(90); /* a hang is a failure, never a stuck make check */
        /* On a loaded machine a peer may take seconds to post a receive. */
        setenv("FAKEVERBS_RNR_MS", "20000", 1);
        apply_env(strdup(env ? env : ""));
        exit(fn(fd)); /* exit, not _exit: LeakSanitizer checks each case */
    }
    return pid;
}

/* Runs fn in two processes (one when two is 0); role 1 may be meant to die (expect_kill). */
static int run(const char *name, case_fn fn, int two, const char *env0, const char *env1,
               int expect_kill)
{
    int sv[2] = {-1, -1}, st0, st1 = 0, ok;
    const char *only = getenv("TEST_PROVIDER_ONLY"); /* run the cases whose name has this */
    if (only && !strstr(name, only))
        return -1;
    if (two && socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
        return 0;
    pid_t p0 = spawn(0, fn, sv[0], sv[1], env0);
    pid_t p1 = two ? spawn(1, fn, sv[1], sv[0], env1) : -1;
    if (two) {
        close(sv[0]);
        close(sv[1]);
    }
    /* Role 0 first: a killed role 1 stays a zombie meanwhile, which the provider must see. */
    waitpid(p0, &st0, 0);
    if (two)
        waitpid(p1, &st1, 0);
    ok = WIFEXITED(st0) && WEXITSTATUS(st0) == 0;
    if (two)
        ok = ok && (expect_kill ? WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL
                                : WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
    if (!ok)
        fprintf(stderr, "  %s: wait status %#x%s\n", name, st0, two ? "" : " (one process)");
    if (!ok && two)
        fprintf(stderr, "  %s: role 1 wait status %#x\n", name, st1);
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
    fflush(stdout);
    return ok;
}

/* process_vm_writev needs ptrace rights over the peer (Yama, seccomp may refuse them). */
static int cross_process_copy_allowed(void)
{
    int p[2];
    char c = 0, got = 1;
    if (pipe(p) < 0)
        return 0;
    pid_t pid = fork();
    if (pid == 0) {
        close(p[1]);
        if (read(p[0], &c, 1) < 0)
            _exit(1);
        _exit(0);
    }
    struct iovec l = {&got, 1}, r = {&c, 1};
    ssize_t n = process_vm_readv(pid, &l, 1, &r, 1, 0);
    int err = errno;
    close(p[1]);
    close(p[0]);
    waitpid(pid, NULL, 0);
    if (n != 1)
        printf("process_vm_readv: %s\n", strerror(err));
    return n == 1;
}

int main(void)
{
    Dl_info info;
    if (!dladdr((void *)ibv_get_device_list, &info) || !info.dli_fname ||
        !strstr(info.dli_fname, "verbs-provider")) {
        printf("FAIL: libibverbs comes from %s, not the test double (set LD_LIBRARY_PATH)\n",
               info.dli_fname ? info.dli_fname : "?");
        return 1;
    }
    if (!cross_process_copy_allowed()) {
        printf("SKIP: cross-process memory access is not permitted here\n");
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int pass = 0, total = 0;
#define RUN(...)                                                                                   \
    do {                                                                                           \
        int ok_ = run(__VA_ARGS__);                                                                \
        total += ok_ >= 0;                                                                         \
        pass += ok_ > 0;                                                                           \
    } while (0)
    RUN("listing: RoCE devices from FAKEVERBS_DEVICES", t_listing_roce, 0,
        "FAKEVERBS_DEVICES=loomfake0:1,loomfake1:2 FAKEVERBS_LINK_LAYER=ethernet", NULL, 0);
    RUN("listing: default InfiniBand device, reg_mr checks", t_listing_ib, 0, NULL, NULL, 0);
    RUN("listing: FAKEVERBS_DEVICES empty gives no devices", t_no_devices, 0,
        "FAKEVERBS_DEVICES=", NULL, 0);
    RUN("modify_qp: state machine and attribute masks", t_modify_masks, 0, NULL, NULL, 0);
    RUN("RoCE: GRH required, send over GID", t_roce_grh, 1, "FAKEVERBS_LINK_LAYER=ethernet",
        "FAKEVERBS_LINK_LAYER=ethernet", 0);
    RUN("SEND/RECV, inline, imm; RNR wait, buffer read when run", t_send_recv, 1, NULL, NULL, 0);
    RUN("RDMA_WRITE and WRITE_WITH_IMM, 4 MiB", t_rdma_write, 1, NULL, NULL, 0);
    RUN("remote access errors and rae fault", t_remote_access, 1, "FAKEVERBS_FAULT=rae@5", NULL, 0);
    RUN("local errors: lkey, length, wrong dlid", t_local_errors, 1, "FAKEVERBS_RETRY_MS=300", NULL,
        0);
    RUN("RNR retry exceeded", t_rnr, 1, "FAKEVERBS_RNR_MS=300", NULL, 0);
    RUN("queue depth: ENOMEM, SQ freed by polled CQE", t_queue_depth, 1, NULL, NULL, 0);
    RUN("CQ overrun", t_cq_overrun, 1, NULL, NULL, 0);
    RUN("QP error flush and qperr fault", t_qp_error, 1, "FAKEVERBS_RETRY_MS=300",
        "FAKEVERBS_FAULT=qperr@5", 0);
    RUN("dead peer: RETRY_EXC_ERR", t_dead_peer, 1, "FAKEVERBS_RETRY_MS=300", NULL, 1);
    printf("%d passed, %d failed\n", pass, total - pass);
    return pass == total ? 0 : 1;
}
