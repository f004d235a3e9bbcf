/* libtessera: what a container can do to the files the library reads.
 *
 * The budget file must be the read-only regular file of its size the runtime mounted (a
 * tenant's own file bind-mounted over it in a user namespace is writable unless the tenant
 * also remounts it read-only: a speed bump, not a wall; the node daemon checks from the host
 * which file every GPU process sees).  The library is managed -- a missing budget file
 * refuses device memory -- when tessera's marker is there or when the library itself was
 * loaded from the path the device plugin mounts it at, which covering /run/tessera does not
 * change.
 *
 * The ledger is writable by the container, which can truncate it under a process that has
 * it mapped: the next access of the mapping would kill the process with SIGBUS.  A SIGBUS
 * inside the ledger's mapping instead replaces the mapping with private zeros and marks the
 * ledger lost: the process goes on, refuses device memory from then on, and keeps its
 * launch tokens to itself.  Any other SIGBUS goes to the handler that was there before.
 */
#include "guard.h"

#include "formats.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

int budget_file_ok(int fd, const char **why)
{
    struct stat st;
    struct statvfs vfs;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        *why = "not a regular file";
        return 0;
    }
    if (st.st_size != (off_t)TB_FILE_SIZE) {
        *why = "not the size of a budget file";
        return 0;
    }
    if (fstatvfs(fd, &vfs) || !(vfs.f_flag & ST_RDONLY)) {
        *why = "writable (not the read-only mount the runtime made)";
        return 0;
    }
    return 1;
}

int th_managed(void)
{
    if (access(TB_MARKER_PATH, F_OK) == 0)
        return 1;
    Dl_info info;
    return dladdr((void *)&th_managed, &info) && info.dli_fname &&
           strcmp(info.dli_fname, TB_LIB_PATH) == 0;
}

/* ---- the ledger's mapping ---- */
static void *volatile guarded;  /* base of the mapping a SIGBUS may hit, or NULL */
static void (*volatile on_lost)(void);
static struct sigaction prev_bus;

static void on_sigbus(int sig, siginfo_t *si, void *ctx)
{
    char *base = guarded, *a = si ? (char *)si->si_addr : NULL;
    if (base && a >= base && a < base + TL_FILE_SIZE) {
        int e = errno;
        void *m = mmap(base, TL_FILE_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        errno = e;
        if (m != MAP_FAILED) {
            void (*lost)(void) = on_lost;
            if (lost)
                lost();
            return; /* the access runs again, on the zeros */
        }
    }
    if (prev_bus.sa_flags & SA_SIGINFO) {
        prev_bus.sa_sigaction(sig, si, ctx);
    } else if (prev_bus.sa_handler == SIG_DFL || prev_bus.sa_handler == SIG_IGN) {
        /* the fault happens again on return, and then does what it always did */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    } else {
        prev_bus.sa_handler(sig);
    }
}

void guard_ledger(void *base, void (*lost)(void))
{
    static int installed;
    on_lost = lost;
    guarded = base;
    if (installed || !base)
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &prev_bus) == 0)
        installed = 1;
}
