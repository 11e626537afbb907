/* file.c - the file:// store: one file per key in a directory that every
 * rank sees (a shared file system across hosts, or /tmp on one host).
 *
 * Readers never lock: every value is written to a temporary name in the same
 * directory and renamed into place, so a reader sees the old file or the new
 * one, never half of one. Writers (set, add, cas, delete) of one key serialise
 * on a per-key lock file with flock(), which makes add and cas atomic across
 * processes. On NFS, Linux turns flock() into a whole-file POSIX lock carried by
 * the lock manager (NLM, or NFSv4 itself), so the lock holds across hosts; a
 * mount with "nolock" or "local_lock=flock" loses that and is not supported.
 * NFS may also cache a missing name for up to its attribute-cache time
 * (lookupcache, acdirmax), which delays, but never breaks, a wait.
 *
 * Key names: bytes outside [A-Za-z0-9._-] are written %XX, so '/' in keys makes
 * no subdirectories by itself. A file name holds at most 255 bytes while a key
 * escapes to up to 3 KiB, so long names are cut into 200-byte pieces, all but
 * the last being directories: "d.<piece>/.../k.<last piece>". The prefixes
 * keep a directory, a value ("k."), its lock ("l.") and temporaries (".t.")
 * from ever sharing a name.
 *
 * Other users of the machine must not steer a rank through the directory: it
 * must be a real directory (no symlink), ours, and not writable by others
 * unless sticky; every file is opened with O_NOFOLLOW | O_NONBLOCK and must be
 * a regular file of ours (a planted symlink, FIFO or someone else's file is an
 * error, never followed, waited on or believed). What we create is 0700/0600;
 * LOOM_FILE_STORE_GROUP=1 makes it 0770/0660 and trusts the group instead, for
 * a directory several users share. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "base/settings.h"
#include "store.h"

#define PIECE_MAX      200
#define POLL_MIN_S     0.001
#define POLL_MAX_S     0.050

/* What the store creates, alone or shared with the group (LOOM_FILE_STORE_GROUP). */
#define DIR_MODE(group)  ((group) ? 0770 : 0700)
#define FILE_MODE(group) ((group) ? 0660 : 0600)
/* Flags of every open: never through a symlink, never blocked on a FIFO. */
#define SAFE_OPEN        (O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)

typedef struct file_store {
    char *dir;          /* no trailing '/' */
    int group;          /* LOOM_FILE_STORE_GROUP=1: shared with the group */
    double op_timeout;  /* bound on waiting for a key's lock */
    char host[64];      /* this host's name, for temporary file names */
} file_store_t;

/* Where one key lives. */
typedef struct key_path {
    char *file;         /* dir/d.../k.<last piece> */
    char *lock;         /* dir/d.../l.<last piece> */
    size_t leaf_len;    /* length of the directory part of file */
} key_path_t;

static void sleep_s(double s)
{
    if (s <= 0)
        return;
    struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int keep_byte(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '.' || ch == '_' || ch == '-';
}

static loom_status_t key_path_make(const file_store_t *fs, const char *key, key_path_t *kp,
                                   loom_err_t *err)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t dlen = strlen(fs->dir), klen = strlen(key);
    /* Escaping triples a byte at most; every piece adds "/d." or "/k.". */
    size_t cap = dlen + 3 * klen + 3 * (3 * klen / PIECE_MAX + 2) + 1;
    char *file = malloc(cap), *lock = malloc(cap);

    if (file == NULL || lock == NULL) {
        free(file);
        free(lock);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory for a store file name");
    }
    size_t n = 0, piece_start;
    memcpy(file, fs->dir, dlen);
    n = dlen;
    memcpy(file + n, "/k.", 3);
    n += 3;
    piece_start = n;
    for (size_t i = 0; i < klen; i++) {
        unsigned char ch = (unsigned char)key[i];
        size_t unit = keep_byte(ch) ? 1 : 3;
        if (n - piece_start + unit > PIECE_MAX) {
            /* The piece so far becomes a directory. */
            file[piece_start - 2] = 'd';
            memcpy(file + n, "/k.", 3);
            n += 3;
            piece_start = n;
        }
        if (unit == 1) {
            file[n++] = (char)ch;
        } else {
            file[n++] = '%';
            file[n++] = hex[ch >> 4];
            file[n++] = hex[ch & 15];
        }
    }
    file[n] = '\0';
    memcpy(lock, file, n + 1);
    lock[piece_start - 2] = 'l';
    kp->file = file;
    kp->lock = lock;
    kp->leaf_len = piece_start - 3;
    return LOOM_SUCCESS;
}

static void key_path_free(key_path_t *kp)
{
    free(kp->file);
    free(kp->lock);
}

/* errno for "not a regular file" (a FIFO, device or directory where a value
 * belongs): there is none, so a private value that why() names. */
#define EFTYPE_NOT_REG (-1000)

static const char *why(int e)
{
    switch (e) {
    case EFTYPE_NOT_REG:
        return "not a regular file (planted by someone else?)";
    case ELOOP:
        return "a symbolic link (planted by someone else?)";
    case EPERM:
        return "owned by another user (for a store shared by a group, LOOM_FILE_STORE_GROUP=1)";
    default:
        return strerror(e);
    }
}

/* Whether an entry of the store (lstat'ed) can be trusted: of the right type,
 * not a symlink, ours unless the group is trusted. errno says why not. */
static int trusted(const struct stat *sb, mode_t type, int group)
{
    if ((sb->st_mode & S_IFMT) != type) {
        errno = S_ISLNK(sb->st_mode) ? ELOOP : type == S_IFDIR ? ENOTDIR : EFTYPE_NOT_REG;
        return 0;
    }
    if (!group && sb->st_uid != geteuid()) {
        errno = EPERM;
        return 0;
    }
    return 1;
}

/* Whether an open file of the store is one to believe; errno says why not. */
static int check_file(int fd, int group)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return -1;
    return trusted(&sb, S_IFREG, group) ? 0 : -1;
}

/* mkdir -p of the first len bytes of path, new directories in mode; those
 * past the first from bytes (inside the store) must be trusted ones. */
static int mkdir_p(const char *path, size_t len, mode_t mode, size_t from, int group)
{
    char *p = strndup(path, len);
    if (p == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int rc = 0;
    for (size_t i = 1; i <= len && rc == 0; i++) {
        if (i < len && p[i] != '/')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, mode) == 0) {
            /* The umask may have taken the group's bits. */
            if (group)
                chmod(p, mode);
        } else if (errno != EEXIST) {
            rc = -1;
        }
        struct stat sb;
        if (rc == 0 && i > from && (lstat(p, &sb) != 0 || !trusted(&sb, S_IFDIR, group)))
            rc = -1;
        p[i] = saved;
    }
    if (rc == 0) {
        struct stat st;
        if (stat(p, &st) != 0)
            rc = -1;
        else if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            rc = -1;
        }
    }
    int e = errno;
    free(p);
    errno = e;
    return rc;
}

/* Take the key's lock, waiting at most the store's timeout. With create == 0 a
 * missing lock file (and so a key never written) gives *fd_p = -1 and success. */
static loom_status_t lock_key(const file_store_t *fs, const key_path_t *kp, int create,
                              int *fd_p, loom_err_t *err)
{
    size_t dlen = strlen(fs->dir);
    if (create && kp->leaf_len > dlen &&
        mkdir_p(kp->file, kp->leaf_len, DIR_MODE(fs->group), dlen, fs->group) != 0)
        return loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot create store directory for %s: %s",
                            kp->file, why(errno));
    int fd = open(kp->lock, O_RDWR | SAFE_OPEN | (create ? O_CREAT : 0), FILE_MODE(fs->group));
    if (fd < 0) {
        if (!create && (errno == ENOENT || errno == ENOTDIR)) {
            *fd_p = -1;
            return LOOM_SUCCESS;
        }
        return loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot open store lock %s: %s", kp->lock,
                            why(errno));
    }
    if (check_file(fd, fs->group) != 0) {
        int e = errno;
        close(fd);
        return loom_err_set(err, LOOM_ERR_TRANSPORT, "refusing store lock %s: %s", kp->lock,
                            why(e));
    }
    if (create && fs->group)
        (void)fchmod(fd, FILE_MODE(fs->group));   /* past the umask; fails on another's: fine */
    /* Non-blocking attempts with backoff, so the wait stays bounded. */
    double deadline = loom_now_s() + fs->op_timeout, backoff = POLL_MIN_S;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK) {
            int e = errno;
            close(fd);
            return loom_err_set(err, LOOM_ERR_TRANSPORT,
                                "cannot lock %s: %s (on NFS, is the lock manager running?)",
                                kp->lock, strerror(e));
        }
        double left = deadline - loom_now_s();
        if (left <= 0) {
            close(fd);
            return loom_err_set(err, LOOM_ERR_TIMEOUT,
                                "could not lock %s within %.1f s: another process holds it",
                                kp->lock, fs->op_timeout);
        }
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < POLL_MAX_S ? backoff * 2 : POLL_MAX_S;
    }
    *fd_p = fd;
    return LOOM_SUCCESS;
}

static void unlock_key(int fd)
{
    if (fd >= 0)
        close(fd);  /* releases the flock */
}

/* Read a key's file: *found_p = 0 when it does not exist. */
static loom_status_t read_value(const file_store_t *fs, const key_path_t *kp, void **val_p,
                                size_t *len_p, int *found_p, loom_err_t *err)
{
    loom_status_t st;
    int fd = open(kp->file, O_RDONLY | SAFE_OPEN);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            *found_p = 0;
            return LOOM_SUCCESS;
        }
        return loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot open %s: %s", kp->file,
                            why(errno));
    }
    struct stat sb;
    if (check_file(fd, fs->group) != 0 || fstat(fd, &sb) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "refusing store file %s: %s", kp->file,
                          why(errno));
        goto close_file;
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > LOOM_STORE_VALUE_MAX) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT,
                          "store file %s is larger than the value limit of %u bytes", kp->file,
                          LOOM_STORE_VALUE_MAX);
        goto close_file;
    }
    /* The size is only a hint; a file is complete once renamed, so read to EOF. */
    size_t cap = (size_t)sb.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory reading %s", kp->file);
        goto close_file;
    }
    for (;;) {
        if (len + 1 == cap) {
            if (cap > LOOM_STORE_VALUE_MAX) {
                st = loom_err_set(err, LOOM_ERR_TRANSPORT,
                                  "store file %s is larger than the value limit of %u bytes",
                                  kp->file, LOOM_STORE_VALUE_MAX);
                goto free_buf;
            }
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory reading %s", kp->file);
                goto free_buf;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - 1 - len);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            st = loom_err_set(err, LOOM_ERR_TRANSPORT, "reading %s: %s", kp->file,
                              strerror(errno));
            goto free_buf;
        }
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    *val_p = buf;
    *len_p = len;
    *found_p = 1;
    return LOOM_SUCCESS;

free_buf:
    free(buf);
close_file:
    close(fd);
    return st;
}

/* Replace the key's file by val, atomically for readers. */
static loom_status_t write_value(const file_store_t *fs, const key_path_t *kp, const void *val,
                                 size_t len, loom_err_t *err)
{
    static unsigned long counter;
    loom_status_t st;
    size_t tcap = kp->leaf_len + strlen(fs->host) + 64;
    char *tmp = malloc(tcap);
    int fd = -1;

    if (tmp == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory for a store file name");
    /* Host and pid tell writers on a shared file system apart; the counter tells
     * apart the handles and threads of one process. */
    for (int tries = 0; fd < 0; tries++) {
        unsigned long n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
        snprintf(tmp, tcap, "%.*s/.t.%s.%ld.%lu", (int)kp->leaf_len, kp->file, fs->host,
                 (long)getpid(), n);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | SAFE_OPEN, FILE_MODE(fs->group));
        if (fd >= 0 && fs->group)
            fchmod(fd, FILE_MODE(fs->group));   /* past the umask */
        if (fd < 0 && (errno != EEXIST || tries > 100)) {
            st = loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot create %s: %s", tmp,
                              strerror(errno));
            goto free_name;
        }
    }
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, (const char *)val + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            st = loom_err_set(err, LOOM_ERR_TRANSPORT, "writing %s: %s", tmp,
                              w < 0 ? strerror(errno) : "no progress");
            goto close_tmp;
        }
        done += (size_t)w;
    }
    /* On NFS, write errors (quota, full disk) may only show up at close. */
    int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "writing %s: %s", tmp, strerror(errno));
        goto unlink_tmp;
    }
    if (rename(tmp, kp->file) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "renaming %s to %s: %s", tmp, kp->file,
                          strerror(errno));
        goto unlink_tmp;
    }
    free(tmp);
    return LOOM_SUCCESS;

close_tmp:
    close(fd);
unlink_tmp:
    unlink(tmp);
free_name:
    free(tmp);
    return st;
}

static loom_status_t file_open(const char *rest, int rank, double timeout_s, loom_err_t *err,
                               void **impl_p)
{
    loom_status_t st;

    if (rest[0] != '/')
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "bad store URI 'file://%s': expected an absolute path, as "
                            "file:///shared/dir", rest);
    file_store_t *fs = calloc(1, sizeof(*fs));
    if (fs == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening store file://%s",
                            rest);
    fs->dir = strdup(rest);
    if (fs->dir == NULL) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory opening store file://%s",
                          rest);
        goto free_store;
    }
    size_t n = strlen(fs->dir);
    while (n > 1 && fs->dir[n - 1] == '/')
        fs->dir[--n] = '\0';
    fs->op_timeout = timeout_s;
    if (gethostname(fs->host, sizeof(fs->host)) != 0)
        strcpy(fs->host, "host");
    fs->host[sizeof(fs->host) - 1] = '\0';
    for (char *p = fs->host; *p != '\0'; p++)
        if (!keep_byte((unsigned char)*p))
            *p = '_';

    loom_store_env_t env = {0};
    if ((st = loom_settings_load_group(LOOM_SG_STORE_FILE, &env, loom_getenv_process, NULL,
                                       err)) != LOOM_SUCCESS)
        goto free_dir;
    fs->group = env.file_group;
    if (mkdir_p(fs->dir, n, DIR_MODE(fs->group), n, fs->group) != 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "cannot create store directory %s: %s",
                          fs->dir, strerror(errno));
        goto free_dir;
    }
    /* The directory decides who can plant names in it. */
    struct stat sb;
    if (lstat(fs->dir, &sb) != 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "store directory %s: %s", fs->dir,
                          strerror(errno));
        goto free_dir;
    }
    if (S_ISLNK(sb.st_mode) || !S_ISDIR(sb.st_mode)) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "store directory %s is %s; give the real "
                          "directory's path", fs->dir,
                          S_ISLNK(sb.st_mode) ? "a symbolic link" : "not a directory");
        goto free_dir;
    }
    if (!fs->group && sb.st_uid != geteuid()) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "store directory %s belongs to uid %u, not "
                          "to this user (%u): its owner could steer this job (for a directory "
                          "shared by a group, LOOM_FILE_STORE_GROUP=1)", fs->dir,
                          (unsigned)sb.st_uid, (unsigned)geteuid());
        goto free_dir;
    }
    if ((sb.st_mode & S_IWOTH) && !(sb.st_mode & S_ISVTX)) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "store directory %s is writable by every "
                          "user and not sticky (mode %04o): anyone could replace its files "
                          "(chmod o-w or +t)", fs->dir, (unsigned)(sb.st_mode & 07777));
        goto free_dir;
    }
    if (access(fs->dir, W_OK | X_OK) != 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG, "cannot write to store directory %s: %s",
                          fs->dir, strerror(errno));
        goto free_dir;
    }
    *impl_p = fs;
    return LOOM_SUCCESS;

free_dir:
    free(fs->dir);
free_store:
    free(fs);
    return st;
}

static void file_close(void *impl)
{
    file_store_t *fs = impl;
    free(fs->dir);
    free(fs);
}

static loom_status_t file_set(void *impl, const char *key, const void *val, size_t len,
                              loom_err_t *err)
{
    file_store_t *fs = impl;
    key_path_t kp;
    int lfd;
    loom_status_t st = key_path_make(fs, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    /* Locked too, so a set cannot slip between the read and write of an add. */
    st = lock_key(fs, &kp, 1, &lfd, err);
    if (st == LOOM_SUCCESS) {
        st = write_value(fs, &kp, val, len, err);
        unlock_key(lfd);
    }
    key_path_free(&kp);
    return st;
}

static loom_status_t file_try_get(void *impl, const char *key, void **val_p, size_t *len_p,
                                  int *found_p, loom_err_t *err)
{
    key_path_t kp;
    loom_status_t st = key_path_make(impl, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    st = read_value(impl, &kp, val_p, len_p, found_p, err);
    key_path_free(&kp);
    return st;
}

static loom_status_t file_wait(void *impl, const char *key, double timeout_s, loom_err_t *err)
{
    key_path_t kp;
    loom_status_t st = key_path_make(impl, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    double deadline = loom_now_s() + timeout_s, backoff = POLL_MIN_S;
    for (;;) {
        if (access(kp.file, F_OK) == 0)
            break;
        if (errno != ENOENT && errno != ENOTDIR) {
            st = loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot look up %s: %s", kp.file,
                              strerror(errno));
            break;
        }
        double left = deadline - loom_now_s();
        if (left <= 0) {
            st = loom_err_set(err, LOOM_ERR_TIMEOUT,
                              "timed out after %.1f s waiting for store key %s", timeout_s, key);
            break;
        }
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < POLL_MAX_S ? backoff * 2 : POLL_MAX_S;
    }
    key_path_free(&kp);
    return st;
}

static loom_status_t file_add(void *impl, const char *key, int64_t delta, int64_t *value_p,
                              loom_err_t *err)
{
    file_store_t *fs = impl;
    key_path_t kp;
    int lfd, found;
    void *val = NULL;
    size_t len;
    int64_t cur = 0, sum;
    loom_status_t st = key_path_make(fs, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    st = lock_key(fs, &kp, 1, &lfd, err);
    if (st != LOOM_SUCCESS)
        goto free_path;
    st = read_value(fs, &kp, &val, &len, &found, err);
    if (st != LOOM_SUCCESS)
        goto unlock;
    if (found && loom_store_parse_int64(val, len, &cur) != 0) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "store key %s does not hold a decimal integer, so it cannot be "
                          "added to", key);
        goto free_value;
    }
    if (__builtin_add_overflow(cur, delta, &sum)) {
        st = loom_err_set(err, LOOM_ERR_INVALID_ARG,
                          "adding %" PRId64 " to store key %s would overflow int64", delta, key);
        goto free_value;
    }
    char text[24];
    int n = snprintf(text, sizeof(text), "%" PRId64, sum);
    st = write_value(fs, &kp, text, (size_t)n, err);
    if (st == LOOM_SUCCESS)
        *value_p = sum;

free_value:
    free(val);
unlock:
    unlock_key(lfd);
free_path:
    key_path_free(&kp);
    return st;
}

static loom_status_t file_cas(void *impl, const char *key, const void *expected, size_t elen,
                              const void *desired, size_t dlen, void **value_p, size_t *len_p,
                              loom_err_t *err)
{
    file_store_t *fs = impl;
    key_path_t kp;
    int lfd, found;
    void *cur = NULL;
    size_t clen = 0;
    loom_status_t st = key_path_make(fs, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    st = lock_key(fs, &kp, 1, &lfd, err);
    if (st != LOOM_SUCCESS)
        goto free_path;
    st = read_value(fs, &kp, &cur, &clen, &found, err);
    if (st != LOOM_SUCCESS)
        goto unlock;
    if (!found) {
        /* An absent key reads as the empty value, as in the tcp store. */
        clen = 0;
        cur = malloc(1);
        if (cur == NULL) {
            st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory in store cas");
            goto unlock;
        }
        ((char *)cur)[0] = '\0';
    }
    if (elen == clen && (clen == 0 || memcmp(expected, cur, clen) == 0)) {
        char *copy = malloc(dlen + 1);
        if (copy == NULL) {
            st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory in store cas");
            goto free_current;
        }
        if (dlen > 0)
            memcpy(copy, desired, dlen);
        copy[dlen] = '\0';
        st = write_value(fs, &kp, desired, dlen, err);
        if (st != LOOM_SUCCESS) {
            free(copy);
            goto free_current;
        }
        free(cur);
        cur = copy;
        clen = dlen;
    }
    *value_p = cur;
    *len_p = clen;
    cur = NULL;

free_current:
    free(cur);
unlock:
    unlock_key(lfd);
free_path:
    key_path_free(&kp);
    return st;
}

static loom_status_t file_del(void *impl, const char *key, int *existed_p, loom_err_t *err)
{
    file_store_t *fs = impl;
    key_path_t kp;
    int lfd;
    loom_status_t st = key_path_make(fs, key, &kp, err);
    if (st != LOOM_SUCCESS)
        return st;
    st = lock_key(fs, &kp, 0, &lfd, err);
    if (st != LOOM_SUCCESS)
        goto free_path;
    if (lfd < 0) {
        /* No lock file: the key was never written. */
        *existed_p = 0;
        goto free_path;
    }
    if (unlink(kp.file) == 0) {
        *existed_p = 1;
    } else if (errno == ENOENT) {
        *existed_p = 0;
    } else {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot remove %s: %s", kp.file,
                          strerror(errno));
    }
    unlock_key(lfd);
free_path:
    key_path_free(&kp);
    return st;
}

static int file_local_host(void *impl, char *host, size_t hostlen)
{
    return -1;
}

const loom_store_ops_t loom_store_file_ops = {
    .size = sizeof(loom_store_ops_t),
    .scheme = "file",
    .open = file_open,
    .close = file_close,
    .set = file_set,
    .try_get = file_try_get,
    .wait = file_wait,
    .add = file_add,
    .cas = file_cas,
    .del = file_del,
    .local_host = file_local_host,
};
