#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

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
