"""Read-only view of a container's ledger (``hook/src/formats.h``, version 1), for
inspection, metrics and the core-share controller.

A slot is live while its owner holds the OFD write lock on byte ``LOCK_BASE + i`` of the
file; the kernel drops that lock when the process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x474C5354  # b"TSLG"
VERSION = 1
NSLOTS = 1024
MAX_DEV = 16
HEADER_SIZE = 4096
SLOT_SIZE = 256
FILE_SIZE = HEADER_SIZE + NSLOTS * SLOT_SIZE
LOCK_BASE = 1 << 40
DEV_OFFSET = 128
DEV = struct.Struct("<8Q")  # used, tat_ns, tokens_milli, launches, wait_ns, waits, oom, reserved
WAIT_HIST_OFFSET = 1152  # u32[MAX_DEV][32], log2 microsecond buckets
WAIT_BUCKETS = 32
HWM_OFFSET = 24  # u32: slots [0, hwm) have been used
SLOT_CHANGES_OFFSET = 28  # u32: bumped after every join and reclaim (0: an older library)
SLOT_HEAD = struct.Struct("<iIQ")  # pid (as the container sees it), owner generation, joined
SLOT_BYTES_OFFSET = 16  # u64[MAX_DEV]: device bytes this slot holds
SLOT_TAIL_OFFSET = 144  # launches, wait_ns, start_ticks, pidns (u64 each)
SLOT_TAIL = struct.Struct("<4Q")
F_OFD_GETLK = 36
FLOCK = struct.Struct("hhqqi4x")  # l_type, l_whence, l_start, l_len, l_pid (x86_64)


@dataclass(frozen=True)
class LedgerDevice:
    used: int
    tokens: float
    wait_s: float
    waits: int
    oom: int
    wait_hist: tuple[int, ...] = ()  # bucket b: waits of [2^(b-1), 2^b) microseconds

    def wait_quantile(self, q: float) -> float:
        """Upper bound, in seconds, of the q-quantile of launch waits (0 when none)."""
        total = sum(self.wait_hist)
        if total == 0:
            return 0.0
        seen = 0
        for b, n in enumerate(self.wait_hist):
            seen += n
            if seen >= q * total:
                return (1 << b) / 1e6
        return (1 << (len(self.wait_hist) - 1)) / 1e6


@dataclass(frozen=True)
class LedgerSlot:
    index: int
    pid: int
    alive: bool
    bytes: tuple[int, ...]
    wait_s: float
    start_ticks: int = 0  # /proc/<pid>/stat starttime, the same in every PID namespace
    pidns: int = 0  # inode of its PID namespace (0: written by a library without it)

    @property
    def identity(self) -> tuple[int, int, int]:
        """(pid in its namespace, start ticks, namespace inode): one process on the host."""
        return self.pid, self.start_ticks, self.pidns


@dataclass(frozen=True)
class LedgerView:
    devices: tuple[LedgerDevice, ...]
    slots: tuple[LedgerSlot, ...]

    def live_pids(self) -> list[int]:
        return [s.pid for s in self.slots if s.alive]

    def live_bytes(self, dev: int = 0) -> int:
        """Bytes held by live processes only (what ``used`` becomes once the dead are reaped)."""
        return sum(s.bytes[dev] for s in self.slots if s.alive)


def _slot_locked(fd: int, index: int) -> bool:
    req = FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, LOCK_BASE + index, 1, 0)
    res = fcntl.fcntl(fd, F_OFD_GETLK, req)
    l_type = FLOCK.unpack(res)[0]
    return bool(l_type != fcntl.F_UNLCK)


_UNREAD = LedgerDevice(0, 0.0, 0.0, 0, 0)
_NO_BYTES = (0,) * MAX_DEV
_NONZERO = re.compile(rb"[^\x00]")


def read_ledger(path: str | os.PathLike[str], only: int | None = None) -> LedgerView:
    """The ledger now; ``only``: decode that device's counters alone (the others, and what
    each slot holds, read as zero)."""
    fd = os.open(Path(path), os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size < FILE_SIZE:
            raise ValueError("ledger too short")
        raw = os.pread(fd, HEADER_SIZE, 0)
        (hwm,) = struct.unpack_from("<I", raw, HWM_OFFSET)
        raw += os.pread(fd, min(hwm, NSLOTS) * SLOT_SIZE, HEADER_SIZE)
        return _parse(raw, fd, only)
    finally:
        os.close(fd)


class LedgerReader:
    """One ledger read again and again (the controller, ten times a second): the file stays
    mapped read-only, so a read copies nothing but the counters it decodes; a ledger replaced
    by a new one (another inode: the container's devices were allocated again) is mapped
    anew, noticed within ``RECHECK_S``."""

    RECHECK_S = 1.0

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._ino: tuple[int, int] | None = None
        self._slots = _SlotCache()
        self._recheck_at = 0.0

    def read(self, only: int | None = None) -> LedgerView:
        if self._map is None or time.monotonic() >= self._recheck_at:
            self._remap_if_replaced()
        assert self._map is not None and self._fd is not None
        return _parse(self._map, self._fd, only, self._slots)

    def _remap_if_replaced(self) -> None:
        st = os.stat(self.path)
        self._recheck_at = time.monotonic() + self.RECHECK_S
        if self._map is None or self._ino != (st.st_dev, st.st_ino):
            self.close()
            if st.st_size < FILE_SIZE:
                raise ValueError("ledger too short")
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._map = mmap.mmap(fd, FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._ino = fd, (st.st_dev, st.st_ino)
            self._slots = _SlotCache()

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _SlotCache:
    """The slot table a reader decoded last time (the controller reads the same ledger ten
    times a second; processes join and leave rarely), kept while the ledger's high-water
    mark and slot-change counter stay the same. Liveness is read again every time. A ledger
    whose counter is 0 (written by a library older than the counter) is decoded every time."""

    def __init__(self) -> None:
        self.key: tuple[int, int] = (0, 0)
        self.heads: list[tuple[int, int, int, int]] = []  # (index, pid, start, pidns)


def _slot_heads(raw: bytes | mmap.mmap, n: int) -> list[tuple[int, int, int, int]]:
    """(index, pid, start ticks, PID namespace) of every slot below ``n`` with a pid."""
    with memoryview(raw) as mv:
        pids = mv[HEADER_SIZE: HEADER_SIZE + n * SLOT_SIZE].cast("i")[:: SLOT_SIZE // 4].tobytes()
    # joining processes take slots anywhere below the high-water mark, so most of [0, hwm)
    # is usually empty: find the others in one C-level pass
    heads = []
    for i in sorted({m.start() // 4 for m in _NONZERO.finditer(pids)}):
        off = HEADER_SIZE + i * SLOT_SIZE
        pid = SLOT_HEAD.unpack_from(raw, off)[0]
        if pid != 0:
            _launches, _wait, start, pidns = SLOT_TAIL.unpack_from(raw, off + SLOT_TAIL_OFFSET)
            heads.append((i, pid, start, pidns))
    return heads


def _parse(raw: bytes | mmap.mmap, fd: int, only: int | None,
           cache: _SlotCache | None = None) -> LedgerView:
    (hwm,) = struct.unpack_from("<I", raw, HWM_OFFSET)
    magic, version, nslots, ndev, hsize, ssize = struct.unpack_from("<6I", raw, 0)
    if (magic, version, nslots, ndev, hsize, ssize) != (
        MAGIC,
        VERSION,
        NSLOTS,
        MAX_DEV,
        HEADER_SIZE,
        SLOT_SIZE,
    ):
        raise ValueError("not a version-1 ledger")
    devices = []
    for d in range(MAX_DEV):
        if only is not None and d != only:
            devices.append(_UNREAD)
            continue
        used, _tat, tokens, _launches, wait_ns, waits, oom, _r = DEV.unpack_from(
            raw, DEV_OFFSET + d * DEV.size
        )
        hist = struct.unpack_from(f"<{WAIT_BUCKETS}I", raw, WAIT_HIST_OFFSET + d * 4 * WAIT_BUCKETS)
        devices.append(LedgerDevice(used, tokens / 1000, wait_ns / 1e9, waits, oom, hist))
    n = min(hwm, NSLOTS)
    (changes,) = struct.unpack_from("<I", raw, SLOT_CHANGES_OFFSET)
    if cache is not None and changes != 0 and cache.key == (n, changes):
        heads = cache.heads
    else:
        heads = _slot_heads(raw, n)
        if cache is not None:
            cache.key, cache.heads = (n, changes), heads
    slots = []
    for i, pid, start, pidns in heads:
        off = HEADER_SIZE + i * SLOT_SIZE
        held = (_NO_BYTES if only is not None
                else struct.unpack_from(f"<{MAX_DEV}Q", raw, off + SLOT_BYTES_OFFSET))
        wait_ns = SLOT_TAIL.unpack_from(raw, off + SLOT_TAIL_OFFSET)[1]
        slots.append(LedgerSlot(i, pid, _slot_locked(fd, i), tuple(held), wait_ns / 1e9, start,
                                pidns))
    return LedgerView(tuple(devices), tuple(slots))
