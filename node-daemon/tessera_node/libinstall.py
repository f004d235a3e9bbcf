"""``python -m tessera_node.libinstall SRC DIR``: install libtessera into a versioned host
directory (the DaemonSet's init container).

``DIR`` (``<libDir>/<version>`` on the host) gets ``libtessera.so`` and the
``ld.so.preload`` that names it where the device plugin mounts it in containers. A version
is installed once and never rewritten: a running container keeps the library it mapped, and
an upgrade installs the new version beside the old one. An existing file with other content
than the image's is an error (two different builds under one version), never overwritten.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tessera_node.deviceplugin.response import LIB_NAME, PRELOAD_NAME, preload_line


class InstallError(Exception):
    pass


def _install(content: bytes, target: Path, mode: int) -> bool:
    """Write ``target`` atomically unless it already holds ``content``; True if written."""
    if target.exists():
        if target.read_bytes() == content:
            return False
        raise InstallError(f"{target} exists with other content: refusing to replace a "
                           "library running containers may have mapped (give the new build "
                           "a new version)")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def install(source: Path, directory: Path) -> list[Path]:
    """Install into ``directory``; returns the files written (none when already there)."""
    try:
        library = source.read_bytes()
    except OSError as exc:
        raise InstallError(f"cannot read {source}: {exc.strerror}") from None
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content, mode in ((LIB_NAME, library, 0o755),
                                (PRELOAD_NAME, preload_line().encode(), 0o644)):
        if _install(content, directory / name, mode):
            written.append(directory / name)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m tessera_node.libinstall SRC DIR", file=sys.stderr)
        return 2
    try:
        written = install(Path(args[0]), Path(args[1]))
    except InstallError as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 1
    print(f"libtessera in {args[1]}: " + (", ".join(p.name for p in written) + " installed"
                                          if written else "already installed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
