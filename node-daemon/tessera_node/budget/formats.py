"""The budget file (version 1), byte for byte as ``hook/src/formats.h`` defines it.

The daemon owns the file and rewrites it *in place* (never truncates or replaces it: the
container sees it through a read-only bind mount of this very inode). A seqlock generation
counter at offset 8 is made odd before a write and even again after it, so libtessera never
uses a torn read.
"""

from __future__ import annotations

import mmap
import os
import struct
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal

MAGIC = 0x47444254  # b"TBDG" little-endian
VERSION = 1
MAX_DEV = 16
BUDGET_FILE_SIZE = 4096
HEADER = struct.Struct("<IIQIIIIIIQQQ")  # magic, version, generation, hsize, esize, ndev,
#                                         flags (state), wait_ms (pending), reserved,
#                                         ledger device, ledger inode, reserved
ENTRY = struct.Struct("<16sIIQIIQQQ")  # uuid, index, flags, mem, core_target, r0, rate, burst,
#                                       context bytes
GEN_OFFSET = 8
LEDGER_OFFSET = 40  # u64 device, u64 inode of the container's ledger (0: none named)

DEV_MEM_LIMIT = 0x1
DEV_CORE_LIMIT = 0x2
DEV_UUID = 0x4
DEV_MIG = 0x8  # with DEV_UUID: the UUID is a MIG device's; the 16 bytes alone do not say so
UUID_PREFIXES = ("GPU-", "MIG-")

# Header flags: the state of the whole file (neither: ready). A pending or refused file names
# no device, so a hook that predates these flags refuses device memory too (hook/README.md,
# "Version skew").
PENDING = 0x1
REFUSED = 0x2
HEADER_FLAGS = PENDING | REFUSED
WAIT_MAX_MS = 120_000
REASON_OFFSET = 3840
REASON_LEN = 256

BudgetFileState = Literal["ready", "pending", "refused"]

assert HEADER.size == 64 and ENTRY.size == 64


def uuid_bytes(text: str) -> bytes:
    """NVML/CUDA UUID text ("GPU-..." or "MIG-...") to its 16 bytes."""
    return uuidlib.UUID(_split_uuid(text)[1]).bytes


def canonical_uuid(text: str) -> str:
    """ "GPU-…"/"MIG-…" in NVML's spelling (prefix, then lowercase 8-4-4-4-12 hex). A UUID
    without its prefix is refused: the prefix says whether it names a GPU or a MIG device."""
    prefix, rest = _split_uuid(text)
    return prefix + str(uuidlib.UUID(rest))


def _split_uuid(text: str) -> tuple[str, str]:
    for prefix in UUID_PREFIXES:
        if text[:4].upper() == prefix:
            return prefix, text[4:]
    raise ValueError(f"UUID {text!r} must start with GPU- or MIG-")


@dataclass(frozen=True)
class BudgetEntry:
    """One visible GPU (or MIG instance) of a container.

    ``memory``: bytes, or None for no memory limit. ``cores``: core budget in percent of the
    GPU (the controller's target), or None for no core limit. ``rate``/``burst``: launch
    tokens per second and bucket depth in tokens, set by the controller. ``context``: device
    bytes one CUDA context holds on this device (``probe.context_bytes``), charged for every
    context a process of the container creates.
    """

    index: int = 0
    uuid: str | None = None
    memory: int | None = None
    cores: float | None = None
    rate: float = 0.0
    burst: float = 1.0
    context: int = 0

    def __post_init__(self) -> None:
        if self.uuid is not None:
            object.__setattr__(self, "uuid", canonical_uuid(self.uuid))

    def pack(self) -> bytes:
        flags = 0
        if self.memory is not None:
            if self.memory < 0:
                raise ValueError("memory must be >= 0")
            flags |= DEV_MEM_LIMIT
        if self.cores is not None:
            if not 0 <= self.cores <= 100 * MAX_DEV:
                raise ValueError("cores out of range")
            flags |= DEV_CORE_LIMIT
        raw_uuid = b"\0" * 16
        if self.uuid:
            flags |= DEV_UUID | (DEV_MIG if self.uuid.startswith("MIG-") else 0)
            raw_uuid = uuid_bytes(self.uuid)
        if not 0 <= self.index < 64:
            raise ValueError("index out of range")
        if not 0 <= self.context < 1 << 64:
            raise ValueError("context bytes out of range")
        rate_milli = round(self.rate * 1000)
        burst_milli = max(1000, round(self.burst * 1000))
        return ENTRY.pack(
            raw_uuid,
            self.index,
            flags,
            self.memory or 0,
            round((self.cores or 0) * 100),
            0,
            max(0, rate_milli),
            burst_milli,
            self.context,
        )

    @classmethod
    def unpack(cls, raw: bytes) -> BudgetEntry:
        u, index, flags, mem, target, _r0, rate, burst, context = ENTRY.unpack(raw)
        return cls(
            index=index,
            uuid=(
                ("MIG-" if flags & DEV_MIG else "GPU-") + str(uuidlib.UUID(bytes=u))
                if flags & DEV_UUID
                else None
            ),
            memory=mem if flags & DEV_MEM_LIMIT else None,
            cores=target / 100 if flags & DEV_CORE_LIMIT else None,
            rate=rate / 1000,
            burst=burst / 1000,
            context=context,
        )


@dataclass
class BudgetFileContents:
    """What one read of a budget file holds (its state, entries and the ledger it names)."""

    generation: int
    entries: list[BudgetEntry] = field(default_factory=list)
    state: BudgetFileState = "ready"
    wait_ms: int = 0
    """Pending: how long a process waits for the budget on its first GPU call."""
    reason: str = ""
    """Refused: why, as the hook prints it."""
    ledger: tuple[int, int] | None = None
    """(device, inode) of the ledger the daemon created for the container; None: none
    named (the library then creates one)."""


def _body(entries: list[BudgetEntry]) -> bytes:
    if len(entries) > MAX_DEV:
        raise ValueError(f"at most {MAX_DEV} devices")
    return b"".join(e.pack() for e in entries)


def _header(generation: int, ndev: int, flags: int = 0, wait_ms: int = 0,
            ledger: tuple[int, int] | None = None) -> bytes:
    dev, ino = ledger or (0, 0)
    return HEADER.pack(
        MAGIC, VERSION, generation, HEADER.size, ENTRY.size, ndev, flags, wait_ms, 0, dev, ino,
        0)


def _reason_bytes(reason: str) -> bytes:
    raw = reason.encode("utf-8", "replace")[: REASON_LEN - 1]
    while raw:  # never cut a character in half
        try:
            raw.decode("utf-8")
            break
        except UnicodeDecodeError:
            raw = raw[:-1]
    return raw


class BudgetFile:
    """A budget file kept open and mapped by its writer; ``update`` rewrites it in place.
    ``ledger``: the (device, inode) of the container's ledger every rewrite names (kept from
    the file when not given)."""

    def __init__(self, path: str | os.PathLike[str],
                 ledger: tuple[int, int] | None = None) -> None:
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < BUDGET_FILE_SIZE:
                os.ftruncate(fd, BUDGET_FILE_SIZE)
            self._map = mmap.mmap(fd, BUDGET_FILE_SIZE, mmap.MAP_SHARED)
        finally:
            os.close(fd)
        if ledger is None:
            dev, ino = struct.unpack_from("<QQ", self._map, LEDGER_OFFSET)
            ledger = (dev, ino) if ino else None
        self.ledger = ledger

    @property
    def generation(self) -> int:
        value: int = struct.unpack_from("<Q", self._map, GEN_OFFSET)[0]
        return value

    def update(self, entries: list[BudgetEntry]) -> int:
        """Publish a new budget (ready); returns its (even) generation."""
        return self._publish(_body(entries), len(entries))

    def set_pending(self, wait_ms: int) -> int:
        """The daemon does not know the container's pod yet: no device memory, and a process
        waits up to ``wait_ms`` on its first GPU call for the budget to become ready."""
        if not 0 <= wait_ms <= WAIT_MAX_MS:
            raise ValueError(f"wait_ms must be in [0, {WAIT_MAX_MS}]")
        return self._publish(b"", 0, flags=PENDING, wait_ms=wait_ms)

    def set_refused(self, reason: str) -> int:
        """No device memory for this container, and the hook says why (one stderr line)."""
        return self._publish(b"", 0, flags=REFUSED, reason=reason)

    def _publish(
        self, body: bytes, ndev: int, flags: int = 0, wait_ms: int = 0, reason: str = ""
    ) -> int:
        gen = self.generation
        gen = gen + 1 if gen % 2 == 0 else gen + 2  # odd: write in progress
        struct.pack_into("<Q", self._map, GEN_OFFSET, gen)
        tail = bytearray(BUDGET_FILE_SIZE - HEADER.size)
        tail[: len(body)] = body
        why = _reason_bytes(reason)
        at = REASON_OFFSET - HEADER.size
        tail[at : at + len(why)] = why
        self._map[HEADER.size : BUDGET_FILE_SIZE] = bytes(tail)
        header = bytearray(_header(gen + 1, ndev, flags, wait_ms, self.ledger))
        # the header except its generation, then the generation (even: stable)
        self._map[0:GEN_OFFSET] = header[0:GEN_OFFSET]
        self._map[GEN_OFFSET + 8 : HEADER.size] = header[GEN_OFFSET + 8 :]
        struct.pack_into("<Q", self._map, GEN_OFFSET, gen + 1)
        return gen + 1

    def read(self) -> BudgetFileContents:
        return parse_budget_file(bytes(self._map))

    def close(self) -> None:
        self._map.close()

    def __enter__(self) -> BudgetFile:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_budget_file(path: str | os.PathLike[str], entries: list[BudgetEntry]) -> int:
    """Create or update a budget file in place; returns the new generation."""
    with BudgetFile(path) as f:
        return f.update(entries)


def parse_budget_file(raw: bytes) -> BudgetFileContents:
    """A budget file's bytes; ValueError when they are not a stable version-1 file."""
    if len(raw) < HEADER.size:
        raise ValueError("budget file shorter than its header")
    (magic, version, gen, hsize, esize, ndev, flags, wait_ms, _r0, ledger_dev, ledger_ino,
     _r1) = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise ValueError("bad magic")
    if version != VERSION:
        raise ValueError(f"unsupported version {version}")
    if hsize != HEADER.size or esize != ENTRY.size or ndev > MAX_DEV:
        raise ValueError("bad layout")
    if gen % 2:
        raise ValueError("write in progress")
    if len(raw) < HEADER.size + ndev * ENTRY.size:
        raise ValueError("budget file shorter than its entries")
    if flags & ~HEADER_FLAGS or flags == HEADER_FLAGS:
        raise ValueError(f"unknown budget state flags {flags:#x}")
    if flags and ndev:
        raise ValueError("a pending or refused budget names devices")
    entries = [
        BudgetEntry.unpack(raw[HEADER.size + i * ENTRY.size : HEADER.size + (i + 1) * ENTRY.size])
        for i in range(ndev)
    ]
    state: BudgetFileState = ("pending" if flags & PENDING else "refused" if flags & REFUSED
                              else "ready")
    reason = ""
    if state == "refused" and len(raw) >= REASON_OFFSET + REASON_LEN:
        field_ = raw[REASON_OFFSET : REASON_OFFSET + REASON_LEN]
        reason = field_.split(b"\0", 1)[0].decode("utf-8", "replace")
    return BudgetFileContents(
        generation=gen,
        entries=entries,
        state=state,
        wait_ms=min(wait_ms, WAIT_MAX_MS),
        reason=reason,
        ledger=(ledger_dev, ledger_ino) if ledger_ino else None,
    )


def read_budget_file(path: str | os.PathLike[str]) -> BudgetFileContents:
    return parse_budget_file(Path(path).read_bytes())
