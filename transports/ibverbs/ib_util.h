/*
 * ib_util.h - the parts of the verbs transport that are pure functions of
 * their inputs, kept apart from verbs.h so they are unit-tested on any build:
 * LOOM_IB_HCA parsing (NCCL syntax), GID choice, the GPUDirect decision and
 * the encoding of the transport's message headers.
 */
#ifndef LOOM_IB_UTIL_H
#define LOOM_IB_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* ---- LOOM_IB_HCA: "mlx5_0:1,mlx5_1", "^mlx5_2", "=mlx5_0" ------------------
 * A leading '^' excludes the listed ports instead of selecting them; a leading
 * '=' (after any '^') asks for exact names instead of prefix matches. A name
 * without ":port" stands for every port of the device. */
#define LOOM_IB_HCA_MAX 32
typedef struct loom_ib_hca_spec {
    char name[64];
    int port;               /* -1: every port */
} loom_ib_hca_spec_t;

typedef struct loom_ib_hca_list {
    int exclude, exact, n;  /* n == 0 with exclude == 0: no filter at all */
    loom_ib_hca_spec_t v[LOOM_IB_HCA_MAX];
} loom_ib_hca_list_t;

/* 0 on success; -1 with a reason in err on a malformed list. */
int loom_ib_hca_parse(const char *text, loom_ib_hca_list_t *l, char *err, size_t errlen);
/* 1 when the list lets (device, port) be used. */
int loom_ib_hca_match(const loom_ib_hca_list_t *l, const char *dev, int port);

/* ---- GID choice -------------------------------------------------------------
 * types[i]: 2 RoCE v2, 1 RoCE v1 / IB, 0 unknown (no sysfs). forced: the
 * LOOM_IB_GID_INDEX value or -1. pref: the 16-byte form (IPv4-mapped for
 * IPv4) of the address the job's traffic uses, or NULL. Returns the index, or
 * -1 when no entry is usable (then err says why). */
int loom_ib_choose_gid(const uint8_t (*gids)[16], const int *types, int n, int forced,
                       const uint8_t *pref, char *err, size_t errlen);
/* 1 when the GID is all zeros (an empty table entry). */
int loom_ib_gid_is_zero(const uint8_t gid[16]);
/* "fe80:0000:...": 39 characters + NUL. */
void loom_ib_gid_format(const uint8_t gid[16], char out[40]);
int loom_ib_gid_parse(const char *text, uint8_t gid[16]);

/* ---- GPUDirect RDMA decision ------------------------------------------------ */
typedef struct loom_gdr_caps {
    int forced;             /* LOOM_NET_GDR: -1 unset, 0 off, 1 on */
    int device_buffer;      /* the buffer is GPU memory */
    int verbs_dmabuf;       /* ibv_reg_dmabuf_mr resolved (rdma-core >= 34) */
    int gpu_dmabuf;         /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: the GPU exports dma-bufs */
    int peermem;            /* nvidia-peermem (or nv_peer_mem) is loaded */
    int near;               /* 1: GPU and HCA share a PCIe switch (distance <= PXB);
                             * 0: farther; -1: unknown (loom_gdr_pci_near) */
    const char *distance;   /* what loom_gdr_pci_near said, or NULL */
} loom_gdr_caps_t;

typedef enum {
    LOOM_GDR_HOST = 0,      /* host memory: plain ibv_reg_mr */
    LOOM_GDR_DMABUF,        /* cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr */
    LOOM_GDR_PEERMEM,       /* ibv_reg_mr on the device pointer */
    LOOM_GDR_STAGING,       /* copy through registered host memory */
    LOOM_GDR_IMPOSSIBLE     /* LOOM_NET_GDR=1 but nothing can register GPU memory */
} loom_gdr_path_t;

/* Whether GPU and HCA are close enough for GPUDirect RDMA to beat staging, as
 * NCCL judges it (NCCL_NET_GDR_LEVEL's default, PXB): from the two devices'
 * sysfs paths, as realpath gives them for /sys/bus/pci/devices/<bus id> and
 * /sys/class/infiniband/<dev>/device, e.g.
 * /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:03:00.0
 * (root complex, root port, then the bridges down to the device). 1: they meet
 * below the root port (a PCIe switch, no CPU in between); 0: only at the root
 * complex (different root ports) or not at all (different root complexes:
 * another host bridge or socket); -1: a path that is not a PCI device's
 * (NULL, a virtual device, no sysfs). what (may be NULL) gets one line. */
int loom_gdr_pci_near(const char *gpu, const char *hca, char *what, size_t whatlen);

/* Which way a buffer goes on the wire; why (may be NULL) gets one line. */
loom_gdr_path_t loom_gdr_decide(const loom_gdr_caps_t *caps, char *why, size_t whylen);
const char *loom_gdr_path_name(loom_gdr_path_t p);

/* ---- message headers ---------------------------------------------------------
 * Every SEND carries one; little-endian, fixed size. EAGER carries its payload
 * after the header; RTS announces a rendezvous (cookie: the sender's id);
 * CTS answers it with where to write (addr, rkey) and the receiver's id that
 * the sender returns as immediate data. */
#define LOOM_IB_HDR_BYTES 56
#define LOOM_IB_HDR_MAGIC 0x4cu
typedef enum { LOOM_IB_EAGER = 1, LOOM_IB_RTS = 2, LOOM_IB_CTS = 3 } loom_ib_msg_t;

typedef struct loom_ib_hdr {
    uint8_t type;
    uint32_t desc;
    uint64_t tag, total, len;
    uint32_t cookie;        /* RTS: sender's id; CTS: the sender's id echoed */
    uint32_t peer_cookie;   /* CTS: receiver's id (the immediate data) */
    uint32_t rkey;
    uint64_t addr;
} loom_ib_hdr_t;

void loom_ib_hdr_encode(const loom_ib_hdr_t *h, uint8_t out[LOOM_IB_HDR_BYTES]);
/* 0 and h filled, or -1 on garbage (bad magic, type, reserved bits, length). */
int loom_ib_hdr_decode(const uint8_t in[LOOM_IB_HDR_BYTES], loom_ib_hdr_t *h);

#endif
