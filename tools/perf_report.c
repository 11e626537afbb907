/* perf_report.c - loom-perf's output: the text table in nccl-tests' layout,
 * and the JSON, CSV and SVG files of the results. Rank 0 writes them all. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom.h>

#include "perf.h"

/* ---- the text table --------------------------------------------------------- */

/* The header of the text table, as nccl-tests prints it: the run, the ranks
 * (b->infos, gathered by rank 0) and the column titles. */
void print_table_header(const bench_t *b)
{
    const opts_t *o = &b->o;
    const char *kind = o->coll == C_P2P ? "Point-to-point" : "Collective";
    printf("# Loom loom-perf version %s\n", loom_version());
    printf("# %s test starting: %s\n", kind, coll_names[o->coll]);
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: 1 validation: %d graph: 0\n",
           o->minbytes, o->maxbytes, o->stepfactor > 1 ? o->stepfactor : o->stepbytes,
           o->stepfactor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->check);
    if (o->nonblocking && o->coll != C_P2P)
        printf("# Non-blocking: loom_i* calls, all iterations posted back to back, then waited for\n");
    if (o->coll == C_P2P)
        printf("# Ranks 0 and 1 over %s: ping-pong latency (half round trip), bandwidth with a "
               "window of %d non-blocking sends\n", transport_name(o), P2P_WINDOW);
    printf("#\n# Using devices\n");
    for (int r = 0; r < b->n; r++)
        printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", (int)b->infos[r].rank,
               0, (int)b->infos[r].pid, b->infos[r].host, -1, "cpu", "host memory");
    if (o->coll != C_P2P) {
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
               "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        char units[160];
        snprintf(units, sizeof(units), "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s",
                 "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                 "(GB/s)");
        printf("%s\n", units);
    }
}

/* nccl-tests' shortening: as many decimals as fit the column, then exponent form. */
static void fmt_num(char *out, size_t len, double v, int width)
{
    int digits = 0;
    for (double p = 1; v >= p && digits < 40; p *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(out, len, "%*.2f", width, v);
    else if (digits < width - 1)
        snprintf(out, len, "%*.1f", width, v);
    else if (digits < width + 1)
        snprintf(out, len, "%*.0f", width, v);
    else
        snprintf(out, len, "%*.1e", width, v);
}

void print_row(const bench_t *b, const row_t *w)
{
    if (b->rank != 0)
        return;
    char root[16];
    snprintf(root, sizeof(root), "%d", w->root);
    printf("%12zu  %12zu  %8s  %6s  %6s", w->bytes, w->count,
           b->o.coll == C_BARRIER ? "none" : types[w->type].name,
           w->op < 0 ? "none" : ops[w->op].name, root);
    for (int m = 0; m < 2; m++) {
        char t[32], alg[32], bus[32], wrong[32];
        fmt_num(t, sizeof(t), w->time[m], 7);
        fmt_num(alg, sizeof(alg), w->algbw[m], 6);
        fmt_num(bus, sizeof(bus), w->busbw[m], 6);
        if (w->reported[m])
            snprintf(wrong, sizeof(wrong), "%g", (double)w->wrong[m]);
        else
            snprintf(wrong, sizeof(wrong), "N/A");
        printf("  %7s  %6s  %6s  %6s", t, alg, bus, wrong);
    }
    printf("\n");
}

/* ---- JSON, CSV -------------------------------------------------------------- */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static int finish_file(FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "loom-perf: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "loom-perf: cannot create %s: %s\n", path, strerror(errno));
    return f;
}

double avg_busbw(const bench_t *b)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < b->nrows; i++)
        for (int m = 0; m < 2; m++, n++)
            sum += b->rows[i].busbw[m];
    return n ? sum / (double)n : 0;
}

int write_json(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    FILE *f = open_out(o->json);
    if (!f)
        return -1;
    fprintf(f, "{\n  \"loom_version\": ");
    json_str(f, loom_version());
    fprintf(f, ",\n  \"collective\": ");
    json_str(f, coll_names[o->coll]);
    fprintf(f, ",\n  \"nranks\": %d,\n  \"config\": {\"minimum_bytes\": %zu, \"maximum_bytes\": %zu, ",
            b->n, o->minbytes, o->maxbytes);
    if (o->stepfactor > 1)
        fprintf(f, "\"step_factor\": %zu, ", o->stepfactor);
    else
        fprintf(f, "\"step_bytes\": %zu, ", o->stepbytes);
    fprintf(f, "\"warmup_iters\": %d, \"iterations\": %d, \"validation\": %d, "
               "\"nonblocking\": %d, \"average\": %d, \"transport\": ",
            o->warmup, o->iters, o->check, o->nonblocking, o->average);
    json_str(f, transport_name(o));
    fprintf(f, "},\n  \"devices\": [");
    for (int r = 0; r < b->n; r++) {
        const rankinfo_t *ri = &b->infos[r];
        fprintf(f, "%s\n    {\"rank\": %d, \"group\": 0, \"pid\": %d, \"hostname\": ", r ? "," : "",
                (int)ri->rank, (int)ri->pid);
        json_str(f, ri->host);
        fprintf(f, ", \"local_rank\": %d, \"device\": -1, \"device_info\": \"host memory\"}",
                (int)ri->local_rank);
    }
    fprintf(f, "\n  ],\n  \"results\": [");
    if (o->coll == C_P2P) {
        for (size_t i = 0; i < nprows; i++)
            fprintf(f, "%s\n    {\"size\": %zu, \"latency_us\": %.6g, \"bandwidth_MBps\": %.6g}",
                    i ? "," : "", prows[i].size, prows[i].latency_us, prows[i].bandwidth_mbs);
    } else {
        for (size_t i = 0; i < b->nrows; i++) {
            const row_t *w = &b->rows[i];
            fprintf(f, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": ", i ? "," : "",
                    w->bytes, w->count);
            json_str(f, o->coll == C_BARRIER ? "none" : types[w->type].name);
            fprintf(f, ", \"redop\": ");
            json_str(f, w->op < 0 ? "none" : ops[w->op].name);
            fprintf(f, ", \"root\": %d", w->root);
            for (int m = 0; m < 2; m++) {
                fprintf(f, ", \"%s\": {\"time\": %.6g, \"alg_bw\": %.6g, \"bus_bw\": %.6g, "
                           "\"nwrong\": ",
                        m ? "in_place" : "out_of_place", w->time[m], w->algbw[m], w->busbw[m]);
                if (w->reported[m])
                    fprintf(f, "%" PRId64 "}", w->wrong[m]);
                else
                    fprintf(f, "null}");
            }
            fprintf(f, "}");
        }
    }
    fprintf(f, "\n  ],\n  \"out_of_bounds\": {\"count\": %d, \"okay\": %s}",
            b->failed_tests, b->failed_tests ? "false" : "true");
    if (o->coll != C_P2P)
        fprintf(f, ",\n  \"average_bus_bandwidth\": {\"bandwidth\": %.6g}", avg_busbw(b));
    fprintf(f, "\n}\n");
    return finish_file(f, o->json);
}

int write_csv(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    FILE *f = open_out(o->csv);
    if (!f)
        return -1;
    if (o->coll == C_P2P) {
        fprintf(f, "size,latency_us,bandwidth_MBps\n");
        for (size_t i = 0; i < nprows; i++)
            fprintf(f, "%zu,%.6g,%.6g\n", prows[i].size, prows[i].latency_us,
                    prows[i].bandwidth_mbs);
    } else {
        fprintf(f, "collective,nranks,size,count,type,redop,root,"
                   "oop_time_us,oop_algbw_GBps,oop_busbw_GBps,oop_nwrong,"
                   "ip_time_us,ip_algbw_GBps,ip_busbw_GBps,ip_nwrong\n");
        for (size_t i = 0; i < b->nrows; i++) {
            const row_t *w = &b->rows[i];
            fprintf(f, "%s,%d,%zu,%zu,%s,%s,%d", coll_names[o->coll], b->n, w->bytes, w->count,
                    o->coll == C_BARRIER ? "none" : types[w->type].name,
                    w->op < 0 ? "none" : ops[w->op].name, w->root);
            for (int m = 0; m < 2; m++) {
                fprintf(f, ",%.6g,%.6g,%.6g,", w->time[m], w->algbw[m], w->busbw[m]);
                if (w->reported[m])
                    fprintf(f, "%" PRId64, w->wrong[m]);
            }
            fprintf(f, "\n");
        }
    }
    return finish_file(f, o->csv);
}

/* ---- SVG plot --------------------------------------------------------------------
 * Two panels side by side, size on a log2 axis in both: bandwidth (linear) on the
 * left, time (log10) on the right. One polyline per series. */

typedef struct {
    char label[96];
    int color, dashed;
    size_t n;
    double *x, *bw, *t;
} series_t;

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLORS ((int)(sizeof(palette) / sizeof(palette[0])))

#define PANEL_W 500
#define PLOT_TOP 60
#define PLOT_BOTTOM 390
#define PLOT_LEFT 75
#define PLOT_RIGHT 475
#define LEGEND_TOP 462
#define LEGEND_ROW 18
#define LEGEND_COLS 3
#define LEGEND_MAX 48

static void size_label(char *out, size_t len, double v)
{
    static const char *const units[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(out, len, "%g%s", v, units[u]);
}

static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

typedef struct {
    double x0, x1;        /* log2 of the x range */
    double y0, y1;        /* the y range: log10 when logy */
    int logy;
    int left;             /* pixel offset of the panel */
} axes_t;

static double map_x(const axes_t *a, double x)
{
    return a->left + PLOT_LEFT + (log2(x) - a->x0) / (a->x1 - a->x0) * (PLOT_RIGHT - PLOT_LEFT);
}

static double map_y(const axes_t *a, double y)
{
    double v = a->logy ? log10(y) : y;
    return PLOT_BOTTOM - (v - a->y0) / (a->y1 - a->y0) * (PLOT_BOTTOM - PLOT_TOP);
}

static int plottable(const axes_t *a, double x, double y)
{
    return x > 0 && isfinite(y) && (!a->logy || y > 0);
}

static void draw_panel(FILE *f, axes_t *a, const series_t *s, size_t ns, int use_t,
                       const char *title, const char *ylabel)
{
    /* Ranges over every plottable point. */
    double xmin = INFINITY, xmax = 0, ymin = INFINITY, ymax = 0;
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < s[k].n; i++) {
            double y = use_t ? s[k].t[i] : s[k].bw[i];
            if (!plottable(a, s[k].x[i], y))
                continue;
            xmin = fmin(xmin, s[k].x[i]);
            xmax = fmax(xmax, s[k].x[i]);
            ymin = fmin(ymin, y);
            ymax = fmax(ymax, y);
        }
    int empty = !(xmax > 0);
    if (empty) {
        xmin = 1;
        xmax = 1024;
        ymin = 1;
        ymax = 10;
    }
    a->x0 = floor(log2(xmin));
    a->x1 = ceil(log2(xmax));
    if (a->x1 <= a->x0)
        a->x1 = a->x0 + 1;
    double ystep;
    if (a->logy) {
        a->y0 = floor(log10(ymin));
        a->y1 = ceil(log10(ymax));
        if (a->y1 <= a->y0)
            a->y1 = a->y0 + 1;
        ystep = ceil((a->y1 - a->y0) / 8);
    } else {
        a->y0 = 0;
        if (!(ymax > 0))
            ymax = 1;
        ystep = nice_step(ymax, 5);
        a->y1 = ceil(ymax / ystep) * ystep;
    }

    int L = a->left;
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">%s</text>\n",
            L + (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_TOP - 12, title);
    /* Grid and tick labels. */
    int xstep = (int)ceil((a->x1 - a->x0) / 10);
    for (double e = a->x0; e <= a->x1 + 1e-9; e += xstep) {
        double X = map_x(a, exp2(e));
        char lab[32];
        size_label(lab, sizeof(lab), exp2(e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", X,
                PLOT_TOP, X, PLOT_BOTTOM);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", X,
                PLOT_BOTTOM + 16, lab);
    }
    for (double v = a->y0; v <= a->y1 + 1e-9 * fmax(1, fabs(a->y1)); v += ystep) {
        double Y = PLOT_BOTTOM - (v - a->y0) / (a->y1 - a->y0) * (PLOT_BOTTOM - PLOT_TOP);
        char lab[32];
        snprintf(lab, sizeof(lab), "%g", a->logy ? pow(10, v) : v);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                L + PLOT_LEFT, Y, L + PLOT_RIGHT, Y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L + PLOT_LEFT - 6,
                Y + 4, lab);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
            L + PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
               "message size (bytes, log scale)</text>\n",
            L + (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_BOTTOM + 38);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 %d %d)\">%s</text>\n",
            L + 18, (PLOT_TOP + PLOT_BOTTOM) / 2, L + 18, (PLOT_TOP + PLOT_BOTTOM) / 2, ylabel);
    if (empty) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">no data</text>\n",
                L + (PLOT_LEFT + PLOT_RIGHT) / 2, (PLOT_TOP + PLOT_BOTTOM) / 2);
        return;
    }
    for (size_t k = 0; k < ns; k++) {
        const char *color = palette[s[k].color % NCOLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color,
                s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
        for (size_t i = 0; i < s[k].n; i++) {
            double y = use_t ? s[k].t[i] : s[k].bw[i];
            if (plottable(a, s[k].x[i], y))
                fprintf(f, "%.1f,%.1f ", map_x(a, s[k].x[i]), map_y(a, y));
        }
        fprintf(f, "\"/>\n");
        if (s[k].n <= 64)
            for (size_t i = 0; i < s[k].n; i++) {
                double y = use_t ? s[k].t[i] : s[k].bw[i];
                if (plottable(a, s[k].x[i], y))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>\n",
                            map_x(a, s[k].x[i]), map_y(a, y), color);
            }
    }
}

int write_plot(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    /* Series: consecutive rows of one type x op x root, out of place and in place. */
    series_t *s = calloc(2 * (b->nrows + 1), sizeof(*s));
    double *pool = calloc(3 * 2 * (b->nrows + nprows + 1), sizeof(double));
    if (!s || !pool) {
        fprintf(stderr, "loom-perf: out of memory\n");
        free(s);
        free(pool);
        return -1;
    }
    size_t ns = 0, used = 0;
    if (o->coll == C_P2P) {
        series_t *p = &s[ns++];
        snprintf(p->label, sizeof(p->label), "ranks 0 and 1, %s", transport_name(o));
        p->x = pool;
        p->bw = pool + nprows;
        p->t = pool + 2 * nprows;
        for (size_t i = 0; i < nprows; i++) {
            p->x[i] = (double)prows[i].size;
            p->bw[i] = prows[i].bandwidth_mbs;
            p->t[i] = prows[i].latency_us;
        }
        p->n = nprows;
    } else {
        int several = o->type < 0 || (coll_reduces(o->coll) && o->op < 0) ||
                      (coll_rooted(o->coll) && o->root < 0);
        for (size_t i = 0; i < b->nrows;) {
            size_t j = i;
            const row_t *w = &b->rows[i];
            while (j < b->nrows && b->rows[j].type == w->type && b->rows[j].op == w->op &&
                   b->rows[j].root == w->root)
                j++;
            for (int m = 0; m < 2; m++) {
                series_t *p = &s[ns];
                char what[64] = "";
                if (several) {
                    snprintf(what, sizeof(what), "%s%s%s", types[w->type].name,
                             w->op >= 0 ? " " : "", w->op >= 0 ? ops[w->op].name : "");
                    if (w->root >= 0)
                        snprintf(what + strlen(what), sizeof(what) - strlen(what), " root %d",
                                 w->root);
                    strcat(what, ", ");
                }
                snprintf(p->label, sizeof(p->label), "%s%s", what,
                         m ? "in-place" : "out-of-place");
                p->color = (int)(ns / 2);
                p->dashed = m;
                p->n = j - i;
                p->x = pool + used;
                p->bw = p->x + p->n;
                p->t = p->bw + p->n;
                used += 3 * p->n;
                for (size_t k = 0; k < p->n; k++) {
                    p->x[k] = (double)b->rows[i + k].bytes;
                    p->bw[k] = b->rows[i + k].busbw[m];
                    p->t[k] = b->rows[i + k].time[m];
                }
                ns++;
            }
            i = j;
        }
    }

    FILE *f = open_out(o->plot);
    if (!f) {
        free(s);
        free(pool);
        return -1;
    }
    /* The legend fills column by column, an even number of rows for collectives so
     * that a series' out-of-place and in-place lines stay side by side. */
    size_t nleg = ns < LEGEND_MAX ? ns : LEGEND_MAX;
    size_t legend_rows = (nleg + LEGEND_COLS - 1) / LEGEND_COLS;
    if (o->coll != C_P2P)
        legend_rows += legend_rows & 1;
    int height = LEGEND_TOP + (int)legend_rows * LEGEND_ROW + (ns > nleg ? LEGEND_ROW : 0) + 10;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            2 * PANEL_W, height, 2 * PANEL_W, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">loom-perf %s, "
               "%d rank%s, Loom %s</text>\n",
            PANEL_W, coll_names[o->coll], b->n, b->n == 1 ? "" : "s", loom_version());
    axes_t left = {.logy = 0, .left = 0}, right = {.logy = 1, .left = PANEL_W};
    if (o->coll == C_P2P) {
        draw_panel(f, &left, s, ns, 0, "unidirectional bandwidth", "bandwidth (MB/s)");
        draw_panel(f, &right, s, ns, 1, "latency (half round trip)", "latency (us, log scale)");
    } else {
        draw_panel(f, &left, s, ns, 0, "bus bandwidth", "busbw (GB/s)");
        draw_panel(f, &right, s, ns, 1, "time per operation", "time (us, log scale)");
    }
    for (size_t k = 0; k < nleg; k++) {
        int X = 40 + (int)(k / legend_rows) * 320;
        int Y = LEGEND_TOP + (int)(k % legend_rows) * LEGEND_ROW;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"2\"%s/>\n",
                X, Y - 4, X + 30, Y - 4, palette[s[k].color % NCOLORS],
                s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", X + 38, Y, s[k].label);
    }
    if (ns > nleg)
        fprintf(f, "<text x=\"40\" y=\"%d\">... and %zu more series</text>\n",
                LEGEND_TOP + (int)legend_rows * LEGEND_ROW,
                ns - nleg);
    fprintf(f, "</svg>\n");
    free(s);
    free(pool);
    return finish_file(f, o->plot);
}
