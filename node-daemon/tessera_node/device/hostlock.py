"""A host file lock per GPU, held by every ``nvidia-smi`` the daemon runs on that GPU.

The lock is an ``flock`` on ``<state dir>/mig-gpu<N>.lock``; the open file is handed to the
``nvidia-smi`` child, so the child holds the lock as long as it runs.  A daemon killed while
``nvidia-smi`` runs leaves that ``nvidia-smi`` behind still changing the GPU; the restarted
daemon waits for the lock, so it never acts on the GPU before the orphan is done (and then
reads the GPU afresh).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


class LockTimeout(Exception):
    """The lock stayed held (an orphaned nvidia-smi still running?)."""


class GPULocks:
    def __init__(self, state_dir: str, wait_s: float = 300.0) -> None:
        self.dir = Path(state_dir)
        self.wait_s = wait_s

    def path(self, gpu: int) -> Path:
        return self.dir / f"mig-gpu{gpu}.lock"

    @contextlib.contextmanager
    def held(self, gpu: int) -> Iterator[int]:
        """The open, locked file descriptor (pass it to the child); waits up to
        ``wait_s`` for another holder to let go."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path(gpu), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    if time.monotonic() > deadline:
                        raise LockTimeout(f"{self.path(gpu)} still held after "
                                          f"{self.wait_s:.0f} s (an nvidia-smi of an "
                                          "earlier tessera-node still running?)") from exc
                    time.sleep(0.05)
            yield fd
        finally:
            os.close(fd)  # the lock goes with the last holder of the open file
