"""The two sides of the ledger fuzz tests, each run as a process of its own.

``mutate PATH SECONDS SEED [--in-place]``: a hostile container's process. For SECONDS it
does to the file at PATH what a container can do to its ledger, at random (seeded): writes
garbage anywhere, truncates, grows, zeroes the header or the counts, and puts a symlink, a
FIFO, a directory or nothing in its place; now and then a valid ledger again, so that the
readers also read real ones. ``--in-place``: only what a container can do to a ledger
mounted as a file (write, truncate, grow: the same inode). Prints what it did, as JSON.

``read PATH SECONDS``: the node daemon's side. For SECONDS it reads the ledger as the daemon
does (the core controller's ``LedgerReader``, the audit's ``read_ledger`` and its ledger
check), and prints as JSON how many reads succeeded, how many were ``LedgerError`` findings
and the longest read. Any other exception, a hang or a signal ends it with an error.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

from tessera_node.budget.ledger import (
    DEV_OFFSET,
    FILE_SIZE,
    HEADER_SIZE,
    SLOT_SIZE,
    LedgerError,
    LedgerReader,
    header_bytes,
    read_ledger,
)


def _valid(rng: random.Random) -> bytes:
    """A ledger a library could have written: a few slots with pids and bytes."""
    raw = bytearray(FILE_SIZE)
    raw[:HEADER_SIZE] = header_bytes()
    hwm = rng.randrange(0, 1025)
    raw[24:28] = hwm.to_bytes(4, "little")
    raw[28:32] = rng.randrange(0, 1 << 32).to_bytes(4, "little")
    for _ in range(rng.randrange(0, 8)):
        i = rng.randrange(0, 1024)
        off = HEADER_SIZE + i * SLOT_SIZE
        raw[off:off + 4] = rng.randrange(-(1 << 31), 1 << 31).to_bytes(4, "little", signed=True)
        raw[off + 16:off + 24] = rng.randrange(0, 1 << 64).to_bytes(8, "little")
    return bytes(raw)


def _clear(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def mutate(path: Path, seconds: float, seed: int, in_place: bool) -> Counter[str]:
    rng = random.Random(seed)
    done: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    ops = ["garbage", "truncate", "grow", "zero_header", "zero_counts", "valid", "valid"]
    if not in_place:
        ops += ["symlink", "symlink_dev", "fifo", "directory", "delete", "replace"]
    while time.monotonic() < deadline:
        op = rng.choice(ops)
        try:
            if op in ("symlink", "symlink_dev", "fifo", "directory", "delete", "replace"):
                _clear(path)
                if op == "symlink":
                    path.symlink_to(path.parent / "elsewhere")
                elif op == "symlink_dev":
                    path.symlink_to("/dev/zero")
                elif op == "fifo":
                    os.mkfifo(path)
                elif op == "directory":
                    path.mkdir()
                elif op == "replace":
                    path.write_bytes(_valid(rng))
            else:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
                             0o666)
                try:
                    if op == "garbage":
                        off = rng.randrange(0, FILE_SIZE)
                        os.pwrite(fd, rng.randbytes(rng.randrange(1, 4097)), off)
                    elif op == "truncate":
                        os.ftruncate(fd, rng.choice([0, 1, 64, HEADER_SIZE,
                                                     rng.randrange(0, FILE_SIZE)]))
                    elif op == "grow":
                        os.ftruncate(fd, FILE_SIZE + rng.randrange(1, 1 << 20))
                    elif op == "zero_header":
                        os.pwrite(fd, bytes(64), 0)
                    elif op == "zero_counts":
                        os.pwrite(fd, bytes(1024), DEV_OFFSET)
                    else:
                        os.ftruncate(fd, FILE_SIZE)
                        os.pwrite(fd, _valid(rng), 0)
                finally:
                    os.close(fd)
            done[op] += 1
        except OSError:
            done["refused:" + op] += 1  # e.g. a FIFO or directory in the way
        time.sleep(rng.choice([0, 0, 0.0005, 0.002]))
    return done


def read(path: Path, seconds: float) -> dict[str, float]:
    reader = LedgerReader(path)
    reader.RECHECK_S = 0.0  # look for a replacement at every read
    out = {"ok": 0, "findings": 0, "longest_s": 0.0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for how in ("controller", "audit"):
            t0 = time.monotonic()
            try:
                if how == "controller":
                    reader.read(only=0)
                else:
                    read_ledger(path)
                out["ok"] += 1
            except LedgerError:
                out["findings"] += 1
            out["longest_s"] = max(out["longest_s"], time.monotonic() - t0)
    reader.close()
    return out


if __name__ == "__main__":
    what, p, secs = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
    if what == "mutate":
        print(json.dumps(mutate(p, secs, int(sys.argv[4]), "--in-place" in sys.argv[5:])))
    else:
        print(json.dumps(read(p, secs)))
