"""libtessera on the host, at a versioned path (I/O).

Containers map ``<state dir>/lib/<version>/libtessera.so`` through a read-only bind mount.
The version is the library's content digest, so a daemon upgraded with a new build installs a
new directory beside the old one and never rewrites a file a running container has mapped
(rewriting a mapped library in place crashes its users; replacing it would leave running
containers on a deleted inode, which is fine, but the bind mount of a new container must
name the new one). A directory that exists already is checked, never rewritten.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from tessera_node.container.response import LIB_NAME, PRELOAD_NAME, preload_line

DIGEST_CHARS = 16


class LibraryError(OSError):
    """libtessera cannot be installed: the device plugin does not serve (fail closed)."""


def version_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_CHARS]


def install(source: str | os.PathLike[str], lib_root: str | os.PathLike[str]) -> Path:
    """Install ``source`` under ``lib_root/<version>/`` (with its ``ld.so.preload``) unless it
    is there already; the directory."""
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise LibraryError(f"libtessera not readable at {source}: {exc.strerror}") from None
    if not data.startswith(b"\x7fELF"):
        raise LibraryError(f"{source} is not a shared library")
    root = Path(lib_root)
    target = root / version_of(data)
    if target.is_dir():
        have = (target / LIB_NAME).read_bytes()
        if have != data or (target / PRELOAD_NAME).read_text() != preload_line():
            raise LibraryError(f"{target} holds another library than its version says; "
                               "remove the directory (no container may be using it)")
        return target
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=root))
    (staging / LIB_NAME).write_bytes(data)
    (staging / PRELOAD_NAME).write_text(preload_line())
    for name in (LIB_NAME, PRELOAD_NAME):
        (staging / name).chmod(0o444)
    staging.chmod(0o755)
    try:
        staging.rename(target)  # atomic: a directory is there whole or not at all
    except OSError:
        if not target.is_dir():
            raise
        for name in (LIB_NAME, PRELOAD_NAME):
            (staging / name).unlink()
        staging.rmdir()  # another daemon installed the same version meanwhile
    return target
