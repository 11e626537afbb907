/* loomrun: starting ranks: fork and exec, the ranks' environment, the remote script ssh runs. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

/* ---- the ranks' environment -------------------------------------------------- */


void env_push(envv_t *e, char *kv)
{
    if (e->n + 2 > e->cap) {
        e->cap = e->cap ? e->cap * 2 : 64;
        e->v = xrealloc(e->v, e->cap * sizeof(char *));
    }
    e->v[e->n++] = kv;
    e->v[e->n] = NULL;
}

static int env_find(const envv_t *e, const char *name)
{
    size_t nlen = strlen(name);
    for (size_t i = 0; i < e->n; i++)
        if (strncmp(e->v[i], name, nlen) == 0 && e->v[i][nlen] == '=')
            return (int)i;
    return -1;
}

void env_set(envv_t *e, const char *name, const char *value)
{
    size_t nlen = strlen(name), vlen = strlen(value);
    char *kv = xrealloc(NULL, nlen + vlen + 2);
    memcpy(kv, name, nlen);
    kv[nlen] = '=';
    memcpy(kv + nlen + 1, value, vlen + 1);
    int i = env_find(e, name);
    if (i >= 0) {
        free(e->v[i]);
        e->v[i] = kv;
    } else {
        env_push(e, kv);
    }
}

void env_unset(envv_t *e, const char *name)
{
    int i = env_find(e, name);
    if (i < 0)
        return;
    free(e->v[i]);
    memmove(&e->v[i], &e->v[i + 1], (e->n - (size_t)i) * sizeof(char *));   /* with the NULL */
    e->n--;
}

void env_init(envv_t *e, int from_environ)
{
    e->v = xrealloc(NULL, sizeof(char *));
    e->v[0] = NULL;
    e->n = e->cap = 0;
    for (char **p = environ; from_environ && p != NULL && *p != NULL; p++)
        env_push(e, xstrdup(*p));
}

void env_free(envv_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i]);
    free(e->v);
}

/* The variables loomrun sets for every rank itself. */
int loomrun_sets(const char *kv)
{
    static const char *const names[] = { "LOOM_RANK", "LOOM_SIZE", "LOOM_LOCAL_RANK",
                                         "LOOM_LOCAL_SIZE", "LOOM_STORE", "LOOM_JOB_ID",
                                         "LOOM_HOST_ID" };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        if (strncmp(kv, names[i], n) == 0 && kv[n] == '=')
            return 1;
    }
    return 0;
}


/* ---- starting ranks ---------------------------------------------------------- */

/* Runs in the forked child. The store server thread of the parent may have
 * held any lock at fork, so nothing here allocates: argv and the environment
 * were built before the fork, and the error text is written piece by piece.
 * in_fd >= 0 becomes stdin; else stdin stays loomrun's if keep_stdin (and it
 * is not a terminal), /dev/null otherwise. out_w/err_w < 0 keep loomrun's. */
static void exec_child(int in_fd, int keep_stdin, int out_w, int err_w, const char *dir,
                       char *const argv[], char *const envp[], pid_t parent)
{
    /* Own process group: the terminal's Ctrl-C reaches loomrun only, which
     * forwards it once, and kill(-pgid) also reaches the rank's children. */
    setpgid(0, 0);
#ifdef __linux__
    /* If loomrun is killed outright (SIGKILL), do not leave the rank running;
     * for an ssh client, its end takes the remote rank with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
#else
    (void)parent;
#endif
    for (int i = 0; i < NFWD; i++)
        sigaction(g_fwd_signals[i], &g_run.orig_act[i], NULL);
    sigaction(SIGCHLD, &g_run.orig_chld, NULL);
    sigaction(SIGPIPE, &g_run.orig_pipe, NULL);   /* SIG_IGN would survive exec */

    if ((out_w >= 0 && dup2(out_w, STDOUT_FILENO) < 0) ||
        (err_w >= 0 && dup2(err_w, STDERR_FILENO) < 0))
        _exit(127);
    if (in_fd >= 0) {
        if (dup2(in_fd, STDIN_FILENO) < 0)
            _exit(127);
    } else if (!keep_stdin || isatty(STDIN_FILENO)) {
        /* Rank 0 may read loomrun's stdin (`cat data | loomrun ...`), but not
         * a terminal: from its own process group a read would stop it with
         * SIGTTIN. */
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0 && nul != STDIN_FILENO) {
            dup2(nul, STDIN_FILENO);
            close(nul);
        }
    }
    const char *what = "execute ", *name = argv[0];
    int e = 0;
    if (dir != NULL && chdir(dir) != 0) {
        e = errno;
        what = "change to directory ";
        name = dir;
    }
#if defined(__linux__) && defined(CLOSE_RANGE_CLOEXEC)
    /* Every fd of ours is O_CLOEXEC already; this also covers any the library
     * (store server sockets) might have opened without it. */
    close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
    sigprocmask(SIG_SETMASK, &g_run.orig_mask, NULL);

    if (e == 0) {
        execvpe(argv[0], argv, envp);
        e = errno;
    }
    const char *parts[] = { "loomrun: cannot ", what, name, ": ", strerror(e), "\n" };
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
        ssize_t r = write(STDERR_FILENO, parts[i], strlen(parts[i]));
        (void)r;
    }
    /* The shell's convention: 127 not found, 126 found but not runnable. */
    _exit(e == ENOENT || e == ENOTDIR ? 127 : 126);
}

static int open_stream(stream_t *s, int rank, int dest, int *write_end)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return -1;
    /* Non-blocking read end so a drain stops at "empty"; the rank's write end
     * stays blocking. */
    fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
    s->fd = p[0];
    s->dest = dest;
    s->rank = rank;
    snprintf(s->prefix, sizeof(s->prefix), "[%d]<%s>: ", rank,
             dest == STDOUT_FILENO ? "stdout" : "stderr");
    if (!g_run.tag)
        s->prefix[0] = '\0';
    s->prefix_len = strlen(s->prefix);
    s->line = NULL;
    s->len = s->cap = 0;
    *write_end = p[1];
    return 0;
}

/* Fork rank r running argv. Its output is tagged unless it is srun (whose
 * output is the job's, already labelled as the user asked srun to). */
int start_rank(int r, char *const argv[], char *const envp[], const char *dir)
{
    rank_t *rk = &g_run.ranks[r];
    int out_w = -1, err_w = -1, ctl[2] = { -1, -1 };

    if (rk->kind != RANK_SRUN) {
        if (open_stream(&rk->out, r, STDOUT_FILENO, &out_w) < 0)
            return -1;
        if (open_stream(&rk->err, r, STDERR_FILENO, &err_w) < 0) {
            close(out_w);
            close_stream(&rk->out);
            return -1;
        }
    }
    if (rk->kind == RANK_SSH) {
        if (pipe2(ctl, O_CLOEXEC) < 0) {
            close(out_w);
            close(err_w);
            close_stream(&rk->out);
            close_stream(&rk->err);
            return -1;
        }
        /* A wedged ssh must never block loomrun's loop. */
        fcntl(ctl[1], F_SETFL, fcntl(ctl[1], F_GETFL) | O_NONBLOCK);
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0)
        exec_child(ctl[0], r == 0 || rk->kind == RANK_SRUN, out_w, err_w, dir, argv, envp,
                   parent);
    int saved = errno;
    if (out_w >= 0)
        close(out_w);
    if (err_w >= 0)
        close(err_w);
    if (ctl[0] >= 0)
        close(ctl[0]);
    if (pid < 0) {
        if (ctl[1] >= 0)
            close(ctl[1]);
        close_stream(&rk->out);
        close_stream(&rk->err);
        errno = saved;
        return -1;
    }
    /* Also set the group here: whichever of parent and child runs first, the
     * group exists before loomrun may signal it. */
    setpgid(pid, pid);
    rk->pid = pid;
    rk->ctl = ctl[1];
    rk->running = 1;
    g_run.nrunning++;
    return 0;
}

/* The command a remote rank's ssh runs there, in the login shell (sh syntax):
 *
 *  - fd 3 keeps ssh's stdin for the watcher; the program gets /dev/null.
 *  - The watcher, in the background, turns each line loomrun writes ("TERM")
 *    into that signal for the whole process group (sshd made the shell a
 *    session and group leader, so the group is the rank and its children),
 *    and at EOF, that is when loomrun or its ssh client went away, sends
 *    SIGTERM and, if the rank is still there after the grace time, SIGKILL.
 *  - The shell traps those signals (a trap, unlike ignoring, is undone for
 *    the program by exec) so that it outlives the program and passes on its
 *    status: 128+N for a death by signal N. ssh itself would report 255 for
 *    a shell killed by a signal, the same as for a failed connection.
 *  - The shell's own stderr goes to /dev/null once the program is set up,
 *    so "Terminated" from bash for the program it waited for does not read
 *    as the rank's output.
 *  - MARKER tells loomrun that the host answered and the program starts. */
/* Settings whose values are secrets (LOOM_SETTING_SECRET in the settings
 * table). A command line is no place for them (ps shows it to every user of
 * both hosts): a remote rank's shell reads them from ssh's standard input
 * before anything else, one line each. Returns the length of the name of
 * secret setting kv ("NAME=value"), or 0. */
static size_t secret_name_len(const char *kv)
{
    for (size_t i = 0; i < loom_num_settings; i++) {
        const loom_setting_t *row = &loom_settings_table[i];
        size_t n = strlen(row->name);
        if ((row->flags & LOOM_SETTING_SECRET) && strncmp(kv, row->name, n) == 0 && kv[n] == '=')
            return n;
    }
    return 0;
}

/* remote_script below, with xenv: the variables the rank gets. Secrets among
 * them are read from stdin, whose first lines loomrun writes into *secrets. */
void remote_script(strbuf_t *b, const char *wdir, int store_port, const host_t *h,
                          const envv_t *xenv, strbuf_t *secrets)
{
    char line[160];
    sb_str(b, "cd -- ");
    sb_quote(b, wdir);
    sb_str(b, " || exit 127\n");
    for (size_t i = 0; i < xenv->n; i++) {
        size_t n = secret_name_len(xenv->v[i]);
        if (n == 0)
            continue;
        const char *val = xenv->v[i] + n + 1;
        if (strchr(val, '\n') != NULL)
            fatal("%.*s holds a newline, which cannot be passed to a remote rank; put the "
                  "secret in a file readable only by you and set %.*s_FILE instead", (int)n,
                  xenv->v[i], (int)n, xenv->v[i]);
        sb_str(b, "IFS= read -r ");
        sb_add(b, xenv->v[i], n);
        sb_str(b, " || exit 127\nexport ");
        sb_add(b, xenv->v[i], n);
        sb_str(b, "\n");
        sb_str(secrets, val);
        sb_str(secrets, "\n");
    }
    sb_str(b, "exec 3<&0 </dev/null\n"
              "trap : INT TERM HUP\n"
              "{ trap '' INT TERM HUP\n"
              "  while read -r s <&3; do kill -s \"$s\" 0; done\n"
              "  kill -s TERM 0\n");
    snprintf(line, sizeof(line), "  if kill -0 $$; then sleep %d; kill -s KILL 0; fi\n",
             GRACE_MS / 1000);
    sb_str(b, line);
    sb_str(b, "} >/dev/null 2>&1 &\n"
              "exec 3<&- 4>&2 2>/dev/null\n");
    if (h->store == NULL) {
        /* No route from here to the host's name (an ssh alias?): the address
         * the host sees this machine's connection come from will do. */
        sb_str(b, "a=${SSH_CLIENT%% *}\n"
                  "case $a in *:*) a=\"[$a]\";; esac\n");
    }
    sb_str(b, "echo '" MARKER "'\n");
    sb_str(b, "env");
    if (h->store == NULL) {
        snprintf(line, sizeof(line), " \"LOOM_STORE=tcp://$a:%d\"", store_port);
        sb_str(b, line);
    }
    for (size_t i = 0; i < xenv->n; i++) {
        if (secret_name_len(xenv->v[i]) > 0)
            continue;
        sb_add(b, " ", 1);
        sb_quote(b, xenv->v[i]);
    }
}

/* Hand a remote rank its secrets: the first lines of its ssh's stdin. */
static void send_secrets(rank_t *rk, const strbuf_t *secrets)
{
    if (secrets->len == 0)
        return;
    /* Far below a pipe's capacity, so the non-blocking write takes it whole. */
    if (write(rk->ctl, secrets->p, secrets->len) != (ssize_t)secrets->len)
        fatal("cannot pass the secrets to a remote rank: %s", strerror(errno));
}

/* The directory remote ranks run in: --wdir, taken relative to where loomrun
 * runs, else that directory. A relative --wdir means the same directory
 * everywhere (a shared file system), not one under each remote home. */
void remote_wdir(const char *wdir, strbuf_t *out)
{
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL)
        fatal("getcwd: %s", strerror(errno));
    if (wdir != NULL && wdir[0] == '/') {
        sb_str(out, wdir);
    } else {
        sb_str(out, cwd);
        if (wdir != NULL) {
            sb_str(out, "/");
            sb_str(out, wdir);
        }
    }
}

/* The environment of local ranks (and srun): ours, -x on top; loomrun's own
 * variables go on last so -x cannot break the rendezvous. Remote ranks get
 * only what is passed on their command line: LOOM_* settings of ours, -x,
 * and loomrun's variables; secrets travel on ssh's stdin instead, since a
 * command line can be seen in ps on both hosts. */
void build_envs(const options_t *o, envv_t *env, envv_t *xenv, int warn_unset)
{
    env_init(env, 1);
    env_init(xenv, 0);
    for (char **p = environ; p != NULL && *p != NULL; p++)
        if (strncmp(*p, "LOOM_", 5) == 0 && !loomrun_sets(*p))
            env_push(xenv, xstrdup(*p));
    for (int i = 0; i < o->nx; i++) {
        const char *x = o->xvars[i];
        const char *eq = strchr(x, '=');
        if (eq != NULL) {
            char *name = xstrdup(x);
            name[eq - x] = '\0';
            env_set(env, name, eq + 1);
            env_set(xenv, name, eq + 1);
            free(name);
        } else if (getenv(x) != NULL) {
            env_set(env, x, getenv(x));
            env_set(xenv, x, getenv(x));
        } else if (warn_unset) {
            fprintf(stderr, "loomrun: warning: -x %s: %s is not set, not passed\n", x, x);
        }
    }
}

/* Start rank r on its remote host through ssh, running o->argv there in wdir
 * with xenv (env is ssh's own). The host has answer_s seconds to start it. */
int start_ssh_rank(int r, const options_t *o, const envv_t *env, const envv_t *xenv,
                   const char *wdir, int port, const char *timeout_opt, double answer_s)
{
    rank_t *rk = &g_run.ranks[r];
    host_t *h = &g_run.hosts[rk->host];
    strbuf_t script = { 0 }, secrets = { 0 };
    remote_script(&script, wdir, port, h, xenv, &secrets);
    for (char **p = o->argv; *p != NULL; p++) {
        sb_add(&script, " ", 1);
        sb_quote(&script, *p);
    }
    sb_str(&script, " 2>&4 4>&-\nexit $?\n");
    char *sargv[24];
    int k = 0;
    sargv[k++] = "ssh";
    sargv[k++] = "-o";
    sargv[k++] = "BatchMode=yes";
    sargv[k++] = "-o";
    sargv[k++] = "StrictHostKeyChecking=accept-new";
    sargv[k++] = "-o";
    sargv[k++] = (char *)timeout_opt;
    /* Keeps "Permanently added ... to the list of known hosts" out of the
     * ranks' output; errors still show. */
    sargv[k++] = "-o";
    sargv[k++] = "LogLevel=ERROR";
    if (o->ssh_port != NULL) {
        sargv[k++] = "-p";
        sargv[k++] = (char *)o->ssh_port;
    }
    if (o->ssh_identity != NULL) {
        sargv[k++] = "-i";
        sargv[k++] = (char *)o->ssh_identity;
    }
    sargv[k++] = "--";   /* a host name is never an option */
    sargv[k++] = h->name;
    sargv[k++] = script.p;
    sargv[k] = NULL;
    int rc = start_rank(r, sargv, env->v, NULL);
    if (rc == 0)
        send_secrets(rk, &secrets);
    rk->answer_by = now_ms() + (long long)(answer_s * 1000);
    sb_free(&script);
    sb_free(&secrets);
    return rc;
}
