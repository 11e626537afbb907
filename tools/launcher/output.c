/* loomrun: output tagging (and --output-filename files). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

/* ---- output tagging -------------------------------------------------------- */

static int is_marker(const stream_t *s, const char *text, size_t n)
{
    size_t m = sizeof(MARKER) - 1;
    return s->len + n == m && (s->len == 0 || memcmp(s->line, MARKER, s->len) == 0) &&
           memcmp(text, MARKER + s->len, n) == 0;
}

/* Print the stderr lines a remote rank wrote before its program started, now
 * that they are the program's business (or explain its failure). */
void flush_held(rank_t *rk)
{
    strbuf_t b = { 0 };
    const char *p = rk->held.p, *end = rk->held.p + rk->held.len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        sb_add(&b, rk->err.prefix, rk->err.prefix_len);
        sb_add(&b, p, n);
        sb_add(&b, "\n", 1);
        p += n + 1;
    }
    if (b.len > 0)
        write_all(STDERR_FILENO, b.p, b.len);
    sb_free(&b);
    sb_free(&rk->held);
}

/* The last non-empty line held back: ssh's reason for failing. */
const char *last_held_line(rank_t *rk)
{
    char *p = rk->held.p;
    if (p == NULL)
        return NULL;
    size_t n = rk->held.len;
    while (n > 0 && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' '))
        p[--n] = '\0';
    if (n == 0)
        return NULL;
    char *nl = memrchr(p, '\n', n);
    return nl ? nl + 1 : p;
}

/* One line of s is complete: s->line[0..len) then text[0..n), ended by a
 * newline in the output when ended (else cut at LINE_CAP or at the end).
 * Append it, tagged, to the batch at *olen, and untagged to g_run.fbuf. */
static void line_done(stream_t *s, size_t *olen, const char *text, size_t n, int ended)
{
    rank_t *rk = &g_run.ranks[s->rank];
    if (rk->kind == RANK_SSH && !rk->started && s->dest == STDOUT_FILENO && ended &&
        is_marker(s, text, n)) {
        s->len = 0;
        rk->started = 1;
        rk->answer_by = -1;
        flush_held(rk);
        return;
    }
    if (s->file >= 0) {
        sb_add(&g_run.fbuf, s->line, s->len);
        sb_add(&g_run.fbuf, text, n);
        if (ended)
            sb_add(&g_run.fbuf, "\n", 1);
    }
    if (rk->kind == RANK_SSH && !rk->started && s->dest == STDERR_FILENO &&
        rk->held.len < HOLD_CAP) {
        sb_add(&rk->held, s->line, s->len);
        sb_add(&rk->held, text, n);
        sb_add(&rk->held, "\n", 1);
        s->len = 0;
        return;
    }
    out_reserve(*olen + s->prefix_len + s->len + n + 1);
    memcpy(g_run.out + *olen, s->prefix, s->prefix_len);
    *olen += s->prefix_len;
    if (s->len > 0)   /* s->line may still be NULL */
        memcpy(g_run.out + *olen, s->line, s->len);
    *olen += s->len;
    memcpy(g_run.out + *olen, text, n);
    *olen += n;
    g_run.out[(*olen)++] = '\n';
    s->len = 0;
}

/* Write out a batch: tagged to the console, untagged to the rank's file. */
static void flush_batch(stream_t *s, size_t olen)
{
    if (olen > 0)
        write_all(s->dest, g_run.out, olen);
    if (g_run.fbuf.len > 0 && s->file >= 0 && write_fd(s->file, g_run.fbuf.p, g_run.fbuf.len) < 0) {
        fprintf(stderr, "loomrun: rank %d: writing its %s file: %s; no longer written\n",
                s->rank, s->dest == STDOUT_FILENO ? "stdout" : "stderr", strerror(errno));
        close(s->file);
        s->file = -1;
    }
    g_run.fbuf.len = 0;
}

/* Tag the complete lines in data; keep the unfinished tail for later. One
 * write per batch keeps a rank's lines whole and cuts syscalls. */
static void feed(stream_t *s, const char *data, size_t n)
{
    size_t olen = 0;
    const char *p = data, *end = data + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl != NULL) {
            line_done(s, &olen, p, (size_t)(nl - p), 1);
            p = nl + 1;
            continue;
        }
        size_t tail = (size_t)(end - p);
        if (s->len + tail > s->cap) {
            size_t cap = s->cap ? s->cap : 256;
            while (cap < s->len + tail)
                cap *= 2;
            s->line = xrealloc(s->line, cap);
            s->cap = cap;
        }
        memcpy(s->line + s->len, p, tail);
        s->len += tail;
        if (s->len >= LINE_CAP)
            line_done(s, &olen, "", 0, 0);
        break;
    }
    flush_batch(s, olen);
}

/* The rank closed the stream or exited: an unfinished last line still gets
 * printed, with a newline so the next tagged line starts cleanly. */
void close_stream(stream_t *s)
{
    if (s->len > 0) {
        size_t olen = 0;
        line_done(s, &olen, "", 0, 0);
        flush_batch(s, olen);
    }
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->file >= 0)
        close(s->file);
    s->file = -1;
    free(s->line);
    s->line = NULL;
    s->len = s->cap = 0;
}

/* Read what is there now. Returns 0 when the stream reached EOF (and is
 * closed), 1 otherwise. With drain, keep reading until the pipe is empty,
 * but not forever: a background child of an exited rank may still write. */
int pump(stream_t *s, int drain)
{
    static char buf[READ_CHUNK];
    int reads = 0;
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, buf, sizeof(buf));
        if (n > 0) {
            feed(s, buf, (size_t)n);
            if (!drain || ++reads >= DRAIN_MAX_READS)
                return 1;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 1;
        } else {
            close_stream(s);
            return 0;
        }
    }
    return 0;
}


/* mkdir -p, for --output-filename. */
int make_dirs(const char *path)
{
    char *p = xstrdup(path);
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            rc = -1;
        *s = c;
        if (c == '\0')
            break;
    }
    free(p);
    return rc;
}

int open_output_file(const char *dir, int rank, const char *which)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/rank.%d", dir, rank);
    if (make_dirs(path) != 0)
        fatal("--output-filename: cannot create %s: %s", path, strerror(errno));
    if (which == NULL)
        return -1;
    snprintf(path, sizeof(path), "%s/rank.%d/%s", dir, rank, which);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        fatal("--output-filename: cannot create %s: %s", path, strerror(errno));
    return fd;
}
