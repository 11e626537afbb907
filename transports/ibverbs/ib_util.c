/* ib_util.c - pure helpers of the verbs transport (see ib_util.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/byteorder.h"
#include "ib_util.h"

/* ---- LOOM_IB_HCA ------------------------------------------------------------ */

int loom_ib_hca_parse(const char *text, loom_ib_hca_list_t *l, char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    if (text == NULL)
        return 0;
    const char *p = text;
    while (*p == ' ')
        p++;
    if (*p == '^') {
        l->exclude = 1;
        p++;
    }
    if (*p == '=') {
        l->exact = 1;
        p++;
    }
    if (*p == '\0') {
        if (l->exclude || l->exact) {
            snprintf(err, errlen, "LOOM_IB_HCA=\"%s\" names no device", text);
            return -1;
        }
        return 0;
    }
    while (*p) {
        const char *end = strchr(p, ',');
        size_t itemlen = end ? (size_t)(end - p) : strlen(p);
        const char *colon = memchr(p, ':', itemlen);
        size_t namelen = colon ? (size_t)(colon - p) : itemlen;
        if (namelen == 0 || namelen >= sizeof(l->v[0].name)) {
            snprintf(err, errlen, "LOOM_IB_HCA=\"%s\": bad device name in \"%.*s\"", text,
                     (int)itemlen, p);
            return -1;
        }
        if (l->n == LOOM_IB_HCA_MAX) {
            snprintf(err, errlen, "LOOM_IB_HCA=\"%s\": more than %d entries", text,
                     LOOM_IB_HCA_MAX);
            return -1;
        }
        loom_ib_hca_spec_t *s = &l->v[l->n];
        memcpy(s->name, p, namelen);
        s->name[namelen] = '\0';
        s->port = -1;
        if (colon) {
            const char *q = colon + 1;
            long port = 0;
            int digits = 0;
            while (q < p + itemlen && *q >= '0' && *q <= '9' && port < 1000) {
                port = port * 10 + (*q - '0');
                q++;
                digits++;
            }
            if (!digits || q != p + itemlen || port < 1 || port > 255) {
                snprintf(err, errlen, "LOOM_IB_HCA=\"%s\": bad port in \"%.*s\" (a number "
                         "from 1)", text, (int)itemlen, p);
                return -1;
            }
            s->port = (int)port;
        }
        l->n++;
        p += itemlen;
        if (*p == ',') {
            p++;
            if (*p == '\0') {
                snprintf(err, errlen, "LOOM_IB_HCA=\"%s\": empty entry after ','", text);
                return -1;
            }
        }
    }
    return 0;
}

int loom_ib_hca_match(const loom_ib_hca_list_t *l, const char *dev, int port)
{
    if (l->n == 0)
        return 1;
    int listed = 0;
    for (int i = 0; i < l->n && !listed; i++) {
        const loom_ib_hca_spec_t *s = &l->v[i];
        int name_ok = l->exact ? strcmp(s->name, dev) == 0
                               : strncmp(s->name, dev, strlen(s->name)) == 0;
        listed = name_ok && (s->port < 0 || s->port == port);
    }
    return l->exclude ? !listed : listed;
}

/* ---- GIDs ------------------------------------------------------------------- */

int loom_ib_gid_is_zero(const uint8_t gid[16])
{
    for (int i = 0; i < 16; i++)
        if (gid[i])
            return 0;
    return 1;
}

static int gid_is_v4mapped(const uint8_t gid[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(gid, prefix, 12) == 0;
}

static int gid_is_linklocal(const uint8_t gid[16])
{
    return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
}

void loom_ib_gid_format(const uint8_t gid[16], char out[40])
{
    for (int i = 0; i < 8; i++)
        snprintf(out + 5 * i, 6, i < 7 ? "%02x%02x:" : "%02x%02x", gid[2 * i], gid[2 * i + 1]);
}

int loom_ib_gid_parse(const char *text, uint8_t gid[16])
{
    for (int i = 0; i < 8; i++) {
        unsigned hi, lo;
        if (sscanf(text + 5 * i, "%2x%2x", &hi, &lo) != 2)
            return -1;
        if (i < 7 && text[5 * i + 4] != ':')
            return -1;
        gid[2 * i] = (uint8_t)hi;
        gid[2 * i + 1] = (uint8_t)lo;
    }
    return text[39] == '\0' || text[39] == ' ' ? 0 : -1;
}

int loom_ib_choose_gid(const uint8_t (*gids)[16], const int *types, int n, int forced,
                       const uint8_t *pref, char *err, size_t errlen)
{
    if (forced >= 0) {
        if (forced >= n || loom_ib_gid_is_zero(gids[forced])) {
            snprintf(err, errlen, "LOOM_IB_GID_INDEX=%d: no such GID on the port (%d entries)",
                     forced, n);
            return -1;
        }
        return forced;
    }
    /* Scores: the address the job uses carried by a RoCE v2 entry wins, then any
     * routable (non-link-local) v2 entry, then entries whose type is unknown
     * ranked the same way (no sysfs: an IPv4-mapped GID is RoCE v2 in practice),
     * and RoCE v1 only as a last resort. */
    int best = -1, best_score = 0;
    for (int i = 0; i < n; i++) {
        if (loom_ib_gid_is_zero(gids[i]))
            continue;
        int score;
        int routable = gid_is_v4mapped(gids[i]) || !gid_is_linklocal(gids[i]);
        int is_pref = pref && memcmp(gids[i], pref, 16) == 0;
        if (types[i] == 2)
            score = is_pref ? 60 : routable ? 50 : 20;
        else if (types[i] == 0)
            score = is_pref ? 55 : gid_is_v4mapped(gids[i]) ? 45 : routable ? 30 : 10;
        else
            score = 5;
        if (score > best_score) {
            best = i;
            best_score = score;
        }
    }
    if (best < 0)
        snprintf(err, errlen, "the port's GID table is empty (no IP address on the RoCE "
                 "interface?); set LOOM_IB_GID_INDEX");
    return best;
}

/* ---- GPUDirect -------------------------------------------------------------- */

static void say(char *why, size_t whylen, const char *text)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", text);
}

/* "0000:03:00.0": domain, bus, device, function in hex. */
static int is_bdf(const char *p, size_t n)
{
    static const char form[] = "hhhh:hh:hh.h";
    if (n != sizeof(form) - 1)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (form[i] == 'h' ? !isxdigit((unsigned char)p[i]) : p[i] != form[i])
            return 0;
    return 1;
}

#define PCI_PATH_MAX 32

/* The components of a PCI device's sysfs path after /sys/devices/: the root
 * complex ("pci0000:00"), then one bus id per bridge down to the device.
 * Their count (2 at least), or -1 when p is not such a path. */
static int pci_split(const char *p, const char *at[PCI_PATH_MAX], size_t len[PCI_PATH_MAX])
{
    static const char top[] = "/sys/devices/";
    if (!p || strncmp(p, top, sizeof(top) - 1) != 0)
        return -1;
    p += sizeof(top) - 1;
    int n = 0;
    while (*p && n < PCI_PATH_MAX) {
        size_t k = strcspn(p, "/");
        if (k) {
            at[n] = p;
            len[n] = k;
            if (n == 0 ? k < 4 || strncmp(p, "pci", 3) != 0 : !is_bdf(p, k))
                return -1;
            n++;
        }
        p += k;
        p += *p == '/';
    }
    return *p || n < 2 ? -1 : n;
}

int loom_gdr_pci_near(const char *gpu, const char *hca, char *what, size_t whatlen)
{
    const char *g[PCI_PATH_MAX], *h[PCI_PATH_MAX];
    size_t gl[PCI_PATH_MAX], hl[PCI_PATH_MAX];
    char text[256];
    int ng = pci_split(gpu, g, gl), nh = pci_split(hca, h, hl);
    if (ng < 0 || nh < 0) {
        snprintf(text, sizeof(text), "no PCI path for the %s (%s)", ng < 0 ? "GPU" : "HCA",
                 ng < 0 ? (gpu && *gpu ? gpu : "none") : (hca && *hca ? hca : "none"));
        say(what, whatlen, text);
        return -1;
    }
    int k = 0;
    while (k < ng && k < nh && gl[k] == hl[k] && memcmp(g[k], h[k], gl[k]) == 0)
        k++;
    const char *gdev = g[ng - 1], *hdev = h[nh - 1];
    int near = k >= 2;
    if (k == 0)
        snprintf(text, sizeof(text), "GPU %.12s and HCA %.12s are under different PCI root "
                 "complexes (%.*s, %.*s): through the CPUs", gdev, hdev, (int)gl[0], g[0],
                 (int)hl[0], h[0]);
    else if (k == 1)
        snprintf(text, sizeof(text), "GPU %.12s and HCA %.12s meet only at the root complex "
                 "%.*s (root ports %.12s, %.12s): through the CPU", gdev, hdev, (int)gl[0], g[0],
                 g[1], h[1]);
    else
        snprintf(text, sizeof(text), "GPU %.12s and HCA %.12s share a PCIe switch below root "
                 "port %.12s (they meet at %.12s)", gdev, hdev, g[1], g[k - 1]);
    say(what, whatlen, text);
    return near;
}

loom_gdr_path_t loom_gdr_decide(const loom_gdr_caps_t *c, char *why, size_t whylen)
{
    if (!c->device_buffer) {
        say(why, whylen, "host memory");
        return LOOM_GDR_HOST;
    }
    if (c->forced == 0) {
        say(why, whylen, "LOOM_NET_GDR=0: GPU buffers are staged through host memory");
        return LOOM_GDR_STAGING;
    }
    /* NCCL's default: GPUDirect only when GPU and HCA are close, since a path
     * through the CPU root complex is often slower than staging. LOOM_NET_GDR=1
     * overrides the distance, never the capabilities. */
    int allowed = c->forced == 1 || c->near == 1;
    int dmabuf = c->verbs_dmabuf && c->gpu_dmabuf;
    char text[400];
    if (allowed && (dmabuf || c->peermem)) {
        snprintf(text, sizeof(text), "GPUDirect RDMA through %s%s%s",
                 dmabuf ? "dma-buf" : "nvidia-peermem", c->forced != 1 && c->distance ? ": " : "",
                 c->forced != 1 && c->distance ? c->distance : "");
        say(why, whylen, text);
        return dmabuf ? LOOM_GDR_DMABUF : LOOM_GDR_PEERMEM;
    }
    if (c->forced == 1) {
        say(why, whylen, "LOOM_NET_GDR=1 but neither dma-buf (rdma-core >= 34 and a GPU "
            "driver that exports dma-bufs) nor the nvidia-peermem module is available");
        return LOOM_GDR_IMPOSSIBLE;
    }
    if ((dmabuf || c->peermem) && c->near < 0) {
        /* NCCL stages then too: GPUDirect through the CPU is often the slower way. */
        snprintf(text, sizeof(text), "distance unknown: staging through host memory (%s; "
                 "LOOM_NET_GDR=1 forces GPUDirect)", c->distance ? c->distance : "not measured");
        say(why, whylen, text);
    } else if (dmabuf || c->peermem) {
        snprintf(text, sizeof(text), "GPU and HCA are not under one PCIe switch%s%s%s: staging "
                 "through host memory (LOOM_NET_GDR=1 forces GPUDirect)",
                 c->distance ? " (" : "", c->distance ? c->distance : "", c->distance ? ")" : "");
        say(why, whylen, text);
    } else
        say(why, whylen, "no GPUDirect RDMA support (no dma-buf, no nvidia-peermem): staging "
            "through host memory");
    return LOOM_GDR_STAGING;
}

const char *loom_gdr_path_name(loom_gdr_path_t p)
{
    switch (p) {
    case LOOM_GDR_HOST: return "host";
    case LOOM_GDR_DMABUF: return "dmabuf";
    case LOOM_GDR_PEERMEM: return "peermem";
    case LOOM_GDR_STAGING: return "staging";
    case LOOM_GDR_IMPOSSIBLE: return "impossible";
    }
    return "?";
}

/* ---- headers ---------------------------------------------------------------- */

void loom_ib_hdr_encode(const loom_ib_hdr_t *h, uint8_t out[LOOM_IB_HDR_BYTES])
{
    out[0] = LOOM_IB_HDR_MAGIC;
    out[1] = h->type;
    out[2] = out[3] = 0;
    loom_put32(out + 4, h->desc);
    loom_put64(out + 8, h->tag);
    loom_put64(out + 16, h->total);
    loom_put64(out + 24, h->len);
    loom_put32(out + 32, h->cookie);
    loom_put32(out + 36, h->peer_cookie);
    loom_put32(out + 40, h->rkey);
    loom_put32(out + 44, 0);
    loom_put64(out + 48, h->addr);
}

int loom_ib_hdr_decode(const uint8_t in[LOOM_IB_HDR_BYTES], loom_ib_hdr_t *h)
{
    if (in[0] != LOOM_IB_HDR_MAGIC || in[1] < LOOM_IB_EAGER || in[1] > LOOM_IB_CTS ||
        in[2] != 0 || in[3] != 0 || loom_get32(in + 44) != 0)
        return -1;
    h->type = in[1];
    h->desc = loom_get32(in + 4);
    h->tag = loom_get64(in + 8);
    h->total = loom_get64(in + 16);
    h->len = loom_get64(in + 24);
    h->cookie = loom_get32(in + 32);
    h->peer_cookie = loom_get32(in + 36);
    h->rkey = loom_get32(in + 40);
    h->addr = loom_get64(in + 48);
    if (h->len > (UINT64_C(1) << 40))
        return -1;   /* no honest message is that large (as LOOM_FRAME_MAX_LEN) */
    return 0;
}
