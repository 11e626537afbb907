/*
 * ib_api.h - libibverbs entry points, resolved with dlopen/dlsym at run time
 * (as NCCL does) so one libloom runs on nodes with and without rdma-core.
 * The data path (post_send, post_recv, poll_cq) needs no symbol: verbs.h's
 * inlines call through the context's ops table.
 */
#ifndef LOOM_IB_API_H
#define LOOM_IB_API_H

#include <infiniband/verbs.h>

typedef struct loom_ib_api {
    struct ibv_device **(*get_device_list)(int *num);
    void (*free_device_list)(struct ibv_device **list);
    const char *(*get_device_name)(struct ibv_device *dev);
    __be64 (*get_device_guid)(struct ibv_device *dev);
    struct ibv_context *(*open_device)(struct ibv_device *dev);
    int (*close_device)(struct ibv_context *ctx);
    int (*query_device)(struct ibv_context *ctx, struct ibv_device_attr *attr);
    /* The exported ibv_query_port fills the fields every provider knows. */
    int (*query_port)(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);
    int (*query_gid)(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *ctx);
    int (*dealloc_pd)(struct ibv_pd *pd);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t len, int access);
    int (*dereg_mr)(struct ibv_mr *mr);
    /* NULL before rdma-core 34. */
    struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset, size_t len,
                                    uint64_t iova, int fd, int access);
    struct ibv_cq *(*create_cq)(struct ibv_context *ctx, int cqe, void *cq_context,
                                struct ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(struct ibv_cq *cq);
    struct ibv_qp *(*create_qp)(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                    struct ibv_qp_init_attr *init);
    int (*destroy_qp)(struct ibv_qp *qp);
    const char *(*wc_status_str)(enum ibv_wc_status status);
} loom_ib_api_t;

/* The table, loaded once per process; NULL with why (a static string's
 * copy in a buffer of the caller) when libibverbs.so.1 cannot be used. */
const loom_ib_api_t *loom_ib_api_load(char *why, size_t whylen);

#endif
