"""Read-only view of a container's ledger (``hook/src/formats.h``, version 1), for
inspection, metrics, the audit and the core-share controller; and the daemon's creation of a
container's ledger at Allocate.

The ledger is writable from inside the container, so everything here treats it as input,
never authority, and survives whatever the container does to it at any moment (truncation,
growth, garbage, a FIFO, a symlink or a directory in its place): the file is opened with
``O_NOFOLLOW | O_NONBLOCK`` and must be a regular file of exactly the ledger's size; it is
read with ``pread`` after ``fstat`` (never mapped: a mapping of a file truncated under it
kills the reader with SIGBUS); sizes and counts come from this module's constants, never
from the header, which is only checked against them. Anything else raises
:class:`LedgerError`: a finding about that container, never a crash of the reader.

A slot is live while its owner holds the OFD write lock on byte ``LOCK_BASE + i`` of the
file; the kernel drops that lock when the process dies, however it dies.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
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
LAUNCHES_GONE_OFFSET = 32  # u64: kernels launched by processes whose slots were reclaimed
LAYOUT = struct.Struct("<6I")  # magic, version, nslots, ndev, header size, slot size
SLOT_HEAD = struct.Struct("<iIQ")  # pid (as the container sees it), owner generation, joined
SLOT_BYTES_OFFSET = 16  # u64[MAX_DEV]: device bytes this slot holds
SLOT_TAIL_OFFSET = 144  # launches, wait_ns, start_ticks, pidns (u64 each)
SLOT_TAIL = struct.Struct("<4Q")
F_OFD_GETLK = 36
FLOCK = struct.Struct("hhqqi4x")  # l_type, l_whence, l_start, l_len, l_pid (x86_64)
OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


class LedgerError(ValueError):
    """The file is not a readable ledger now (gone, replaced, truncated, grown, garbage): a
    finding about its container. The message says what, after "its ledger: ". ``missing``:
    there is no file at all (no process of the container has used the GPU yet where the
    library creates it)."""

    def __init__(self, why: str, missing: bool = False) -> None:
        super().__init__(why)
        self.missing = missing


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
    launches: int = 0  # kernels this process launched (a graph: its kernels)

    @property
    def identity(self) -> tuple[int, int, int]:
        """(pid in its namespace, start ticks, namespace inode): one process on the host."""
        return self.pid, self.start_ticks, self.pidns


@dataclass(frozen=True)
class LedgerView:
    devices: tuple[LedgerDevice, ...]
    slots: tuple[LedgerSlot, ...]
    launches_gone: int = 0
    """Kernels launched by processes whose slots were reclaimed."""

    @property
    def launches(self) -> int:
        """Kernels the container has launched so far, every process's (monotonic but for a
        reclaim read half-way: a count that moves is activity, see audit/idle.py)."""
        return self.launches_gone + sum(s.launches for s in self.slots)

    def live_bytes(self, dev: int = 0) -> int:
        """Bytes held by live processes only (what ``used`` becomes once the dead are reaped)."""
        return sum(s.bytes[dev] for s in self.slots if s.alive)


def header_bytes() -> bytes:
    """A fresh ledger's header, as the library initialises one (formats.h)."""
    raw = bytearray(HEADER_SIZE)
    LAYOUT.pack_into(raw, 0, MAGIC, VERSION, NSLOTS, MAX_DEV, HEADER_SIZE, SLOT_SIZE)
    return bytes(raw)


def create_ledger(path: str | os.PathLike[str], mode: int = 0o666) -> tuple[int, int]:
    """A container's ledger, created and initialised by the daemon before the container
    starts (the library never creates one where the budget file names it): a new file of
    the ledger's size, never an existing one. Returns its identity (device, inode), which the
    budget file carries so that the library and the audit can tell it from any other file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # whatever the umask: the container may run as any user
        os.ftruncate(fd, FILE_SIZE)
        os.pwrite(fd, header_bytes(), 0)
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def open_ledger(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file at ``path`` (never through a symlink,
    never blocking on a FIFO). Raises :class:`LedgerError`."""
    try:
        fd = os.open(Path(path), OPEN_FLAGS)
    except FileNotFoundError:
        raise LedgerError("missing", missing=True) from None
    except OSError as exc:
        why = "a symlink" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0)
        raise LedgerError(f"cannot be opened: {why}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LedgerError(f"not a regular file (mode {mode:o})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _slot_locked(fd: int, index: int) -> bool:
    req = FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, LOCK_BASE + index, 1, 0)
    res = fcntl.fcntl(fd, F_OFD_GETLK, req)
    l_type = FLOCK.unpack(res)[0]
    return bool(l_type != fcntl.F_UNLCK)


def _pread(fd: int, n: int, offset: int) -> bytes:
    """Exactly ``n`` bytes at ``offset``; a file that shrank meanwhile is a LedgerError."""
    raw = os.pread(fd, n, offset)
    if len(raw) != n:
        raise LedgerError(f"changed size while read ({offset + len(raw)} bytes)")
    return raw


def _sized(fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_size != FILE_SIZE:
        raise LedgerError(f"{st.st_size} bytes, not {FILE_SIZE}")
    return st


def read_ledger(path: str | os.PathLike[str], only: int | None = None) -> LedgerView:
    """The ledger now; ``only``: decode that device's counters alone (the others, and what
    each slot holds, read as zero). Raises :class:`LedgerError`."""
    fd = open_ledger(path)
    try:
        _sized(fd)
        return _read(fd, only)
    finally:
        os.close(fd)


class LedgerReader:
    """One ledger read again and again (the controller, ten times a second): the file stays
    open, the slot table is decoded again only when it moves, and a file replaced at the path
    (another inode: the container's devices were allocated again) is opened anew, noticed
    within ``RECHECK_S``. Every read checks the open file's size first and reads it with
    ``pread``, so a ledger truncated, grown or overwritten under it is a LedgerError, never
    a signal."""

    RECHECK_S = 1.0

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None
        self._slots = _SlotCache()
        self._recheck_at = 0.0

    def read(self, only: int | None = None) -> LedgerView:
        if self._fd is None or time.monotonic() >= self._recheck_at:
            self._reopen_if_replaced()
        assert self._fd is not None
        _sized(self._fd)
        return _read(self._fd, only, self._slots)

    def _reopen_if_replaced(self) -> None:
        self._recheck_at = time.monotonic() + self.RECHECK_S
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            self.close()
            raise LedgerError("missing", missing=True) from None
        if self._fd is not None and self._ino == (st.st_dev, st.st_ino):
            return
        self.close()
        fd = open_ledger(self.path)
        fst = os.fstat(fd)
        self._fd, self._ino = fd, (fst.st_dev, fst.st_ino)
        self._slots = _SlotCache()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._ino = None


class _SlotCache:
    """The slot table a reader decoded last time (the controller reads the same ledger ten
    times a second; processes join and leave rarely), kept while the ledger's high-water
    mark and slot-change counter stay the same. Liveness and each used slot are read again
    every time. A ledger whose counter is 0 (written by a library older than the counter) is
    decoded every time."""

    def __init__(self) -> None:
        self.key: tuple[int, int] = (0, 0)
        self.heads: list[int] = []  # indexes of the slots with a pid


_NONZERO = re.compile(rb"[^\x00]")


def _used_slots(table: bytes, n: int) -> list[int]:
    """Indexes of the slots below ``n`` whose pid is not 0."""
    with memoryview(table) as mv:
        pids = mv[: n * SLOT_SIZE].cast("i")[:: SLOT_SIZE // 4].tobytes()
    # joining processes take slots anywhere below the high-water mark, so most of [0, hwm)
    # is usually empty: find the others in one C-level pass
    return sorted({m.start() // 4 for m in _NONZERO.finditer(pids)})


_UNREAD = LedgerDevice(0, 0.0, 0.0, 0, 0)
_NO_BYTES = (0,) * MAX_DEV


def parse_header(raw: bytes, only: int | None = None) -> tuple[tuple[LedgerDevice, ...],
                                                                 int, int]:
    """(devices, slots in use below, slot changes) of a ledger header (``HEADER_SIZE``
    bytes). Raises LedgerError for anything but version 1's layout; the high-water mark is
    clamped to the slots there are."""
    if len(raw) < HEADER_SIZE:
        raise LedgerError("header too short")
    if LAYOUT.unpack_from(raw, 0) != (MAGIC, VERSION, NSLOTS, MAX_DEV, HEADER_SIZE,
                                      SLOT_SIZE):
        raise LedgerError("not a version-1 ledger (its header is not one)")
    devices = []
    for d in range(MAX_DEV):
        if only is not None and d != only:
            devices.append(_UNREAD)
            continue
        used, _tat, tokens, _launches, wait_ns, waits, oom, _r = DEV.unpack_from(
            raw, DEV_OFFSET + d * DEV.size)
        hist = struct.unpack_from(f"<{WAIT_BUCKETS}I", raw,
                                  WAIT_HIST_OFFSET + d * 4 * WAIT_BUCKETS)
        devices.append(LedgerDevice(used, tokens / 1000, wait_ns / 1e9, waits, oom, hist))
    (hwm,) = struct.unpack_from("<I", raw, HWM_OFFSET)
    (changes,) = struct.unpack_from("<I", raw, SLOT_CHANGES_OFFSET)
    return tuple(devices), min(hwm, NSLOTS), changes


def parse_slot(index: int, raw: bytes, alive: bool, only: int | None = None
               ) -> LedgerSlot | None:
    """One slot's 256 bytes; None when it has no pid."""
    pid = SLOT_HEAD.unpack_from(raw, 0)[0]
    if pid == 0:
        return None
    held = (_NO_BYTES if only is not None
            else struct.unpack_from(f"<{MAX_DEV}Q", raw, SLOT_BYTES_OFFSET))
    launches, wait_ns, start, pidns = SLOT_TAIL.unpack_from(raw, SLOT_TAIL_OFFSET)
    return LedgerSlot(index, pid, alive, tuple(held), wait_ns / 1e9, start, pidns, launches)


def _read(fd: int, only: int | None, cache: _SlotCache | None = None) -> LedgerView:
    head = _pread(fd, HEADER_SIZE, 0)
    devices, n, changes = parse_header(head, only)
    (gone,) = struct.unpack_from("<Q", head, LAUNCHES_GONE_OFFSET)
    table: bytes | None = None
    if cache is not None and changes != 0 and cache.key == (n, changes):
        used = cache.heads
    else:
        table = _pread(fd, n * SLOT_SIZE, HEADER_SIZE)
        used = _used_slots(table, n)
        if cache is not None:
            cache.key, cache.heads = (n, changes), used
    slots = []
    for i in used:
        raw = (table[i * SLOT_SIZE: (i + 1) * SLOT_SIZE] if table is not None
               else _pread(fd, SLOT_SIZE, HEADER_SIZE + i * SLOT_SIZE))
        s = parse_slot(i, raw, _slot_locked(fd, i), only)
        if s is not None:
            slots.append(s)
    return LedgerView(devices, tuple(slots), gone)
