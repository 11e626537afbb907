#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

LOOM_API const char *loom_version(void)
{
    return PACKAGE_VERSION;
}

LOOM_API const char *loom_strerror(loom_status_t s)
{
    switch (s) {
    case LOOM_SUCCESS: return "success";
    case LOOM_ERR_INVALID_ARG: return "invalid argument";
    case LOOM_ERR_NO_MEMORY: return "out of memory";
    case LOOM_ERR_TIMEOUT: return "timed out";
    case LOOM_ERR_PEER_LOST: return "peer lost";
    case LOOM_ERR_TRANSPORT: return "transport error";
    case LOOM_ERR_MISMATCH: return "ranks disagree on the call";
    case LOOM_ERR_UNSUPPORTED: return "unsupported";
    case LOOM_ERR_AUTH: return "handshake refused or LOOM_AUTH_KEY check failed";
    case LOOM_ERR_ABORTED: return "aborted";
    case LOOM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

loom_status_t loom_err_set(loom_err_t *err, loom_status_t status, const char *fmt, ...)
{
    if (err == NULL || err->status != LOOM_SUCCESS)
        return status;
    err->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    return status;
}

void loom_err_clear(loom_err_t *err)
{
    err->status = LOOM_SUCCESS;
    err->msg[0] = '\0';
}
