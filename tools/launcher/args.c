/* loomrun: the command line. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

#include <stdarg.h>

/* ---- command line ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
        "Usage: loomrun [-np N] [-H HOSTS | --hostfile FILE] [options] prog [args...]\n"
        "\n"
        "Start N ranks of prog: forked on this machine, through ssh on other hosts,\n"
        "or through srun inside a Slurm allocation. loomrun serves the ranks'\n"
        "rendezvous store and tags their output with the rank.\n"
        "\n"
        "Where the ranks run:\n"
        "  -np N, -n N       number of ranks (default: the hosts' slots, or SLURM_NTASKS)\n"
        "  -H, --host HOSTS  host1:slots,host2:slots (slots default to 1); ranks fill\n"
        "                    the hosts in order. localhost, 127.0.0.1, this machine's\n"
        "                    name and addresses fork here, other hosts go through ssh\n"
        "  --hostfile FILE   one host per line as \"host slots=N\"; # starts a comment\n"
        "  --ssh-port P      port of the remote hosts' sshd\n"
        "  --ssh-identity-file FILE  private key for ssh (ssh -i)\n"
        "  --wdir DIR        directory the ranks run in (default: the current one,\n"
        "                    on remote hosts too)\n"
        "Without -H and --hostfile, inside a Slurm allocation (SLURM_JOB_ID set) the\n"
        "job is `srun --ntasks=N --kill-on-bad-exit=1 prog args`, elsewhere N local\n"
        "ranks (-H localhost:N forces that inside an allocation too).\n"
        "\n"
        "Options:\n"
        "  -x VAR=value      set VAR in the ranks' environment\n"
        "  -x VAR            pass loomrun's value of VAR (local ranks inherit loomrun's\n"
        "                    whole environment; remote ones get -x variables and LOOM_*)\n"
        "  --timeout S       seconds a Loom call may wait (LOOM_TIMEOUT for the ranks);\n"
        "                    also the time a host has to answer (default: LOOM_TIMEOUT,\n"
        "                    else %.0f)\n"
        "  --output-filename DIR  also write rank N's stdout and stderr to\n"
        "                    DIR/rank.N/stdout and DIR/rank.N/stderr (under srun,\n"
        "                    srun writes them instead of the console)\n"
        "  --tag-output      prefix every line with \"[R]<stdout>: \" or \"[R]<stderr>: \"\n"
        "                    (the default)\n"
        "  --no-tag-output   print the ranks' lines as they wrote them, for tools that\n"
        "                    read the output by position (nccl-tests parsers)\n"
        "Elastic jobs (ranks may die, leave and join while the job runs):\n"
        "  --elastic         membership changes rebuild the job instead of ending it:\n"
        "                    ranks get LOOM_ELASTIC=1 and LOOM_ELASTIC_ID\n"
        "  --min-np A        fewest ranks the job may run with (default 1)\n"
        "  --max-np B        most ranks (default: -np, else no limit); with it the\n"
        "                    job starts on every slot there is, up to B (all: no limit)\n"
        "  --host-discovery-script S  prints the usable hosts, one \"host[:slots]\" a\n"
        "                    line; run every --discovery-interval seconds (default 1)\n"
        "  --slots-per-host K  slots of a host the script lists without a count\n"
        "  --elastic-timeout T  seconds a rebuild waits for missing ranks, and the job\n"
        "                    may stay below --min-np (default: --timeout or 600)\n"
        "  --reset-limit L   fail the job when it would reset (form a new epoch)\n"
        "                    more than L times\n"
        "  --blacklist-failures F  rank failures after which a host is not used\n"
        "                    for --blacklist-cooldown C seconds (defaults 1 and 60)\n"
        "  -h, --help        show this help and exit\n"
        "  --version         show the version and exit\n"
        "  --                end of options (for a program whose name starts with '-')\n"
        "\n"
        "Each rank gets LOOM_RANK, LOOM_SIZE, LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE (its\n"
        "place among the ranks on its host), LOOM_STORE (tcp://ADDR:PORT, served by\n"
        "loomrun on 127.0.0.1, or on all interfaces when a host is remote) and\n"
        "LOOM_JOB_ID; with -H or --hostfile also LOOM_HOST_ID=the host as given, so\n"
        "-H localhost:2,127.0.0.1:2 acts out two nodes on this machine. Under srun,\n"
        "srun numbers the ranks (SLURM_PROCID...). Outside srun and --elastic, Horovod's\n"
        "HOROVOD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE, _CROSS_RANK, _CROSS_SIZE and\n"
        "_HOSTNAME are set too.\n"
        "Every output line is prefixed with \"[R]<stdout>: \" or \"[R]<stderr>: \" unless\n"
        "--no-tag-output is given (whole lines are never mixed either way).\n"
        "SIGINT, SIGTERM and SIGHUP are forwarded to all ranks, remote ones included;\n"
        "a remote rank also ends when its ssh connection does. When a rank exits\n"
        "non-zero or is killed, the others get SIGTERM and %d s later SIGKILL, and\n"
        "loomrun names the rank and its host and exits with that rank's code (128+N\n"
        "for signal N). A host ssh cannot reach ends the job with code 255.\n",
        DEFAULT_ANSWER_S, GRACE_MS / 1000);
}

void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loomrun: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'loomrun --help' for more information.\n", stderr);
    va_end(ap);
    exit(EXIT_USAGE);
}


/* The value of an option: "--opt=value" or the next argument. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, const char *eq)
{
    if (eq != NULL)
        return eq + 1;
    if (*i + 1 >= argc)
        usage_error("option %s needs a value", name);
    return argv[++*i];
}

static void parse_hostlist(options_t *o, const char *list)
{
    const char *p = list;
    for (;;) {
        size_t n = strcspn(p, ",");
        const char *name = p, *slots = NULL;
        size_t nlen = n;
        if (n > 0 && p[0] == '[') {
            /* [IPv6]:slots */
            const char *close = memchr(p, ']', n);
            if (close == NULL)
                usage_error("-H: '%.*s' has '[' without ']'", (int)n, p);
            name = p + 1;
            nlen = (size_t)(close - name);
            if (close + 1 < p + n) {
                if (close[1] != ':')
                    usage_error("-H: '%.*s' is not [address]:slots", (int)n, p);
                slots = close + 2;
            }
        } else {
            const char *colon = memchr(p, ':', n);
            /* Two colons without brackets: a bare IPv6 address, one slot. */
            if (colon != NULL && memchr(colon + 1, ':', (size_t)(p + n - colon - 1)) == NULL) {
                nlen = (size_t)(colon - p);
                slots = colon + 1;
            }
        }
        int s = 1;
        if (slots != NULL && (s = parse_slots(slots, (size_t)(p + n - slots))) < 0)
            usage_error("-H: '%.*s': the slots are not an integer >= 1", (int)n, p);
        if (nlen == 0)
            usage_error("-H: '%s' has an empty host name", list);
        add_host(&o->hosts, &o->nhosts, name, nlen, s);
        if (p[n] == '\0')
            break;
        p += n + 1;
    }
}

/* Open MPI's and Horovod's format: "host [slots=N] [max_slots=M]" per line;
 * '#' starts a comment. max_slots is accepted and ignored (we never
 * oversubscribe). */
static void parse_hostfile(options_t *o, const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        usage_error("--hostfile %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int lineno = 0;
    while (getline(&line, &cap, f) >= 0) {
        lineno++;
        line[strcspn(line, "#\r\n")] = '\0';
        char *save = NULL, *host = strtok_r(line, " \t", &save);
        if (host == NULL)
            continue;
        int slots = 1;
        for (char *tok; (tok = strtok_r(NULL, " \t", &save)) != NULL;) {
            if (strncmp(tok, "slots=", 6) == 0) {
                if ((slots = parse_slots(tok + 6, strlen(tok + 6))) < 0)
                    usage_error("%s:%d: '%s': the slots are not an integer >= 1", path, lineno,
                                tok);
            } else if (strncmp(tok, "max_slots=", 10) != 0 && strncmp(tok, "max-slots=", 10) != 0) {
                usage_error("%s:%d: unexpected '%s' (the format is \"host slots=N\")", path,
                            lineno, tok);
            }
        }
        add_host(&o->hosts, &o->nhosts, host, strlen(host), slots);
    }
    free(line);
    fclose(f);
    if (o->nhosts == 0)
        usage_error("--hostfile %s names no host", path);
}

static int is_var_name(const char *s, size_t n)
{
    if (n == 0 || isdigit((unsigned char)s[0]))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_')
            return 0;
    return 1;
}

/* --elastic and the options that go with it, at argv[*i] (a, of which the
 * name is nlen long; eq: its "=value", if any). Returns 0 when a is none. */
static int parse_elastic_option(int argc, char **argv, int *i, const char *a, size_t nlen,
                                const char *eq, options_t *o)
{
#define IS_LONG(s) (nlen == sizeof(s) - 1 && strncmp(a, s, nlen) == 0)
    if (IS_LONG("--elastic")) {
        if (eq != NULL)
            usage_error("--elastic takes no value");
        o->elastic = 1;
    } else if (IS_LONG("--min-np") || IS_LONG("--max-np") || IS_LONG("--slots-per-host") ||
               IS_LONG("--reset-limit") || IS_LONG("--blacklist-failures")) {
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)nlen, a);
        const char *v = opt_value(argc, argv, i, name, eq);
        int n = parse_slots(v, strlen(v));
        if (strcmp(name, "--max-np") == 0 && strcmp(v, "all") == 0)
            n = EVERY_SLOT;
        if (strcmp(name, "--reset-limit") == 0 && strcmp(v, "0") == 0)
            n = 0;
        if (n < 0)
            usage_error("%s: '%s' is not a count (an integer >= 1)", name, v);
        if (strcmp(name, "--min-np") == 0)
            o->min_np = n;
        else if (strcmp(name, "--max-np") == 0)
            o->max_np = n;
        else if (strcmp(name, "--slots-per-host") == 0)
            o->slots_per_host = n;
        else if (strcmp(name, "--reset-limit") == 0)
            o->reset_limit = n;
        else
            o->blacklist_failures = n;
    } else if (IS_LONG("--host-discovery-script")) {
        o->discovery = opt_value(argc, argv, i, "--host-discovery-script", eq);
        if (o->discovery[0] == '\0')
            usage_error("--host-discovery-script: empty command");
    } else if (IS_LONG("--elastic-timeout") || IS_LONG("--blacklist-cooldown") ||
               IS_LONG("--discovery-interval")) {
        char name[32];
        snprintf(name, sizeof(name), "%.*s", (int)nlen, a);
        const char *v = opt_value(argc, argv, i, name, eq);
        char *end;
        double t = strtod(v, &end);
        if (end == v || *end != '\0' || !(t > 0) || t > 1e7)
            usage_error("%s: '%s' is not a positive number of seconds", name, v);
        if (strcmp(name, "--elastic-timeout") == 0) {
            o->elastic_timeout_s = t;
            o->elastic_timeout = v;
        } else if (strcmp(name, "--blacklist-cooldown") == 0) {
            o->blacklist_cooldown_s = t;
        } else {
            o->discovery_interval_s = t;
        }
    } else {
        return 0;
    }
#undef IS_LONG
    return 1;
}

void parse_args(int argc, char **argv, options_t *o)
{
    memset(o, 0, sizeof(*o));
    o->reset_limit = -1;
    o->xvars = xrealloc(NULL, (size_t)argc * sizeof(char *));
    strbuf_t hostlist = { 0 };
    int i;
    for (i = 1; i < argc; i++) {
        char *a = argv[i];
        if (a[0] != '-')
            break;   /* the program: everything after belongs to it */
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        /* Long options accept "--opt=value" too. */
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        size_t nlen = eq != NULL ? (size_t)(eq - a) : strlen(a);
#define IS_LONG(s) (nlen == sizeof(s) - 1 && strncmp(a, s, nlen) == 0)

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--version") == 0) {
            printf("loomrun (Loom) %d.%d.%d\n", LOOM_VERSION_MAJOR, LOOM_VERSION_MINOR,
                   LOOM_VERSION_PATCH);
            exit(0);
        } else if (strcmp(a, "-np") == 0 || strcmp(a, "-n") == 0 || IS_LONG("--np")) {
            const char *v = opt_value(argc, argv, &i, "-np", eq);
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (end == v || *end != '\0' || errno != 0 || n < 1 || n > INT_MAX / 2)
                usage_error("-np: '%s' is not a rank count (an integer >= 1)", v);
            o->np = (int)n;
        } else if (strcmp(a, "-H") == 0 || IS_LONG("--host") || IS_LONG("--hosts")) {
            const char *v = opt_value(argc, argv, &i, "-H", eq);
            if (v[0] == '\0')
                usage_error("-H: no hosts given");
            if (hostlist.len > 0)
                sb_add(&hostlist, ",", 1);
            sb_str(&hostlist, v);
        } else if (IS_LONG("--hostfile")) {
            o->hostfile = opt_value(argc, argv, &i, "--hostfile", eq);
        } else if (IS_LONG("--ssh-port")) {
            const char *v = opt_value(argc, argv, &i, "--ssh-port", eq);
            int p = parse_slots(v, strlen(v));
            if (p < 1 || p > 65535)
                usage_error("--ssh-port: '%s' is not a port (1-65535)", v);
            o->ssh_port = v;
        } else if (IS_LONG("--ssh-identity-file")) {
            o->ssh_identity = opt_value(argc, argv, &i, "--ssh-identity-file", eq);
            if (o->ssh_identity[0] == '\0')
                usage_error("--ssh-identity-file: empty file name");
        } else if (IS_LONG("--wdir") || strcmp(a, "-wdir") == 0) {
            o->wdir = opt_value(argc, argv, &i, "--wdir", eq);
            if (o->wdir[0] == '\0')
                usage_error("--wdir: empty directory name");
        } else if (IS_LONG("--tag-output") || IS_LONG("--no-tag-output")) {
            if (eq)
                usage_error("%.*s takes no value", (int)nlen, a);
            g_run.tag = IS_LONG("--tag-output");
        } else if (IS_LONG("--output-filename")) {
            o->output_dir = opt_value(argc, argv, &i, "--output-filename", eq);
            if (o->output_dir[0] == '\0')
                usage_error("--output-filename: empty directory name");
        } else if (strcmp(a, "-x") == 0) {
            const char *v = opt_value(argc, argv, &i, "-x", NULL);
            if (!is_var_name(v, strcspn(v, "=")))
                usage_error("-x: '%s' does not start with a variable name", v);
            o->xvars[o->nx++] = v;
        } else if (IS_LONG("--timeout")) {
            const char *v = opt_value(argc, argv, &i, "--timeout", eq);
            char *end;
            double t = strtod(v, &end);
            if (end == v || *end != '\0' || !(t > 0) || t > 1e7)
                usage_error("--timeout: '%s' is not a positive number of seconds", v);
            o->timeout = v;
            o->timeout_s = t;
        } else if (parse_elastic_option(argc, argv, &i, a, nlen, eq, o)) {
            /* --elastic and its options */
        } else {
            usage_error("unknown option '%s'", a);
        }
#undef IS_LONG
    }
    if (i >= argc)
        usage_error("no program to run");
    if (!o->elastic && (o->min_np || o->max_np || o->discovery || o->slots_per_host ||
                        o->elastic_timeout_s > 0 || o->reset_limit >= 0 ||
                        o->blacklist_cooldown_s > 0 || o->blacklist_failures ||
                        o->discovery_interval_s > 0))
        usage_error("--min-np, --max-np, --host-discovery-script, --slots-per-host, "
                    "--elastic-timeout, --reset-limit and the blacklist options need --elastic");
    if (o->elastic && o->min_np && o->max_np && o->min_np > o->max_np)
        usage_error("--min-np %d is more than --max-np %d", o->min_np, o->max_np);
    if (hostlist.len > 0 && o->hostfile != NULL)
        usage_error("-H and --hostfile: give the hosts one way");
    if (hostlist.len > 0)
        parse_hostlist(o, hostlist.p);
    else if (o->hostfile != NULL)
        parse_hostfile(o, o->hostfile);
    sb_free(&hostlist);
    o->argv = argv + i;
}
