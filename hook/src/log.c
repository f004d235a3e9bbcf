/* libtessera: logging.  One line on stderr, prefixed with the process ID, written in one
 * write(2) so that lines of several processes do not interleave. */
#include "hook.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void th_log(const char *fmt, ...)
{
    char buf[512];
    int n = snprintf(buf, sizeof buf, "tessera[%d]: ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof buf)
        n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n <= 0)
        return;
    if ((size_t)n >= sizeof buf - 1)
        n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}
