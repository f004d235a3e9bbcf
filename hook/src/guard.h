/* libtessera: what a container can do to the library's files (guard.c). */
#ifndef TESSERA_GUARD_H
#define TESSERA_GUARD_H

#include "hook.h"

#pragma GCC visibility push(hidden)

/* Is fd the read-only budget file of its size the runtime mounted?  0 with *why if not. */
int budget_file_ok(int fd, const char **why);
/* Did tessera set this container up (its marker, or the library loaded from the device
 * plugin's path)?  Then a missing budget file refuses device memory. */
int th_managed(void);
/* A SIGBUS in [base, +TL_FILE_SIZE) replaces that mapping with private zeros and calls
 * lost() (async-signal-safe) instead of killing the process.  base NULL: no mapping. */
void guard_ledger(void *base, void (*lost)(void));

#pragma GCC visibility pop
#endif
