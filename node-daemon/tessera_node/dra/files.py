"""A file the DRA plugin replaces whole (its checkpoint, a claim's CDI spec): written beside,
flushed, renamed over, the directory flushed, so a daemon killed at any point leaves the old
file or the new one, never half of one (I/O)."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    tmp = path.with_name("." + path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    tmp.replace(path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
