/* fuzz_settings.c - settings parsing (base/settings.c): the input is a list of
 * NAME=VALUE lines that stand for the environment; every LOOM_* setting, the
 * launcher bootstrap and LOOM_ALGO lookups are parsed from it. Variables that
 * name files (*_FILE) stay unset so the fuzzer reads no files. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/algorithms.h"
#include "base/settings.h"
#include "src/comm.h"

#define MAX_VARS 64

typedef struct env {
    size_t n;
    char *name[MAX_VARS], *value[MAX_VARS];
} env_t;

static const char *get(const char *name, void *arg)
{
    const env_t *e = arg;
    size_t n = strlen(name);
    if (n > 5 && strcmp(name + n - 5, "_FILE") == 0)
        return NULL;
    for (size_t i = 0; i < e->n; i++)
        if (strcmp(e->name[i], name) == 0)
            return e->value[i];
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    env_t e = {0};
    for (char *line = text; line != NULL && e.n < MAX_VARS;) {
        char *nl = strchr(line, '\n');
        if (nl != NULL)
            *nl = '\0';
        char *eq = strchr(line, '=');
        if (eq != NULL) {
            *eq = '\0';
            e.name[e.n] = line;
            e.value[e.n++] = eq + 1;
        }
        line = nl != NULL ? nl + 1 : NULL;
    }
    loom_settings_t *s = malloc(sizeof(*s));
    loom_err_t err = {0};
    if (loom_comm_settings_load(s, get, &e, &err) == LOOM_SUCCESS) {
        /* Whatever the settings accepted, the communicator parses into rows. */
        loom_algo_rule_t rules[LOOM_ALGO_MAX_RULES];
        size_t n = 0;
        char why[128];
        if (loom_algo_rules_parse(s->algo, rules, LOOM_ALGO_MAX_RULES, &n, why, sizeof(why)) != 0)
            abort();
        for (size_t i = 0; i < n; i++)
            if (rules[i].name[0] == '\0' || rules[i].min_bytes >= rules[i].max_bytes)
                abort();
    } else if (err.status == LOOM_SUCCESS || err.msg[0] == '\0') {
        abort();   /* a refusal always says why */
    }
    loom_bootstrap_t b;
    loom_err_t berr = {0};
    if (loom_bootstrap_from_env(get, &e, &b, &berr) == LOOM_SUCCESS &&
        (b.rank < 0 || b.rank >= b.size))
        abort();
    free(s);
    free(text);
    return 0;
}
