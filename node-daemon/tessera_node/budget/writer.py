"""The budget files of the device plugin's containers, on the host (I/O only).

Layout under the state directory (one per node, e.g. ``/var/lib/tessera/containers``)::

    managed                   tessera's marker, mounted read-only at /run/tessera/managed
    <key>/budget              the budget file, mounted read-only at /run/tessera/budget
    <key>/run/ledger          the container's ledger, created here at Allocate and mounted
                              (the file alone, writable) at /run/tessera/ledger
    <key>/alloc.json          what Allocate was given (resource, device IDs, units), so a
                              restarted daemon still knows its allocations
    .trash/                   directories on their way out (removed in the background)

``<key>`` names one Allocate's device set (``deviceplugin.matcher.allocation_key``). A file is
created **pending** at Allocate time, rewritten **ready** from the pod's annotation once the
pod is confirmed, or **refused** with a reason; directories are removed when their pods end.
Everything is owned by the daemon (root) and mounted read-only but the ledger, so a budget
file is never writable from inside the container; the ledger is mounted as a file, not its
directory, so a container can write and truncate it but never delete, replace or add a file
(a mount point cannot be removed), and the budget file names the ledger (its device and
inode) for the library and the audit to check. What the container wrote is never walked
while the daemon holds a lock: a directory to remove is renamed into ``.trash`` (one
``rename``) and deleted by a background thread.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tessera_node.budget.formats import (
    BudgetEntry,
    BudgetFile,
    BudgetFileContents,
    read_budget_file,
)
from tessera_node.budget.ledger import create_ledger

log = logging.getLogger("tessera_node.budget")

MARKER = "managed"
BUDGET = "budget"
RUN = "run"
LEDGER = "ledger"
META = "alloc.json"
TRASH = ".trash"


@dataclass(frozen=True)
class AllocationRecord:
    key: str
    resource: str
    device_ids: tuple[str, ...]
    units: tuple[str, ...]
    created: float
    """When the last Allocate of these devices happened (wall clock)."""


class BudgetWriter:
    def __init__(self, root: str | os.PathLike[str], pending_wait_ms: int) -> None:
        self.root = Path(root)
        self.pending_wait_ms = pending_wait_ms
        self.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        marker = self.root / MARKER
        if not marker.exists():
            marker.write_bytes(b"")
            marker.chmod(0o444)

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    def budget_path(self, key: str) -> Path:
        return self.root / key / BUDGET

    def ledger_dir(self, key: str) -> Path:
        return self.root / key / RUN

    def ledger_path(self, key: str) -> Path:
        return self.ledger_dir(key) / LEDGER

    def allocate(self, key: str, resource: str, device_ids: list[str], units: list[str]) -> None:
        """A new use of this device set: the budget file pending, naming a fresh ledger."""
        d = self.root / key
        budget = self.budget_path(key)
        if os.path.lexists(budget) and not (budget.is_file() and not budget.is_symlink()):
            # not the daemon's file: a container runtime makes a directory at a bind
            # mount's missing source (containerd's CRI does), so a container created after
            # its files were removed left one here
            log.warning("an allocation's directory held no budget file: made again",
                        extra={"key": key})
            self._discard(d)
        d.mkdir(exist_ok=True, mode=0o755)
        run = self.ledger_dir(key)
        if os.path.lexists(run):
            self._discard(run)  # the previous user of these devices has ended
        run.mkdir(mode=0o755)
        ledger = create_ledger(run / LEDGER)
        with BudgetFile(self.budget_path(key), ledger=ledger) as f:
            f.set_pending(self.pending_wait_ms)
        meta = {"resource": resource, "device_ids": device_ids, "units": units,
                "created": time.time()}
        tmp = d / (META + ".tmp")
        tmp.write_text(json.dumps(meta))
        tmp.replace(d / META)

    def ready(self, key: str, entries: list[BudgetEntry]) -> None:
        with BudgetFile(self.budget_path(key)) as f:
            f.update(entries)

    def refuse(self, key: str, reason: str) -> None:
        with BudgetFile(self.budget_path(key)) as f:
            f.set_refused(reason)

    def read(self, key: str) -> BudgetFileContents:
        return read_budget_file(self.budget_path(key))

    def remove(self, key: str) -> None:
        self._discard(self.root / key)

    def _discard(self, path: Path) -> None:
        """Out of the way at once (a rename), deleted in the background: a container may
        have left anything in its ledger's directory, however large."""
        trash = self.root / TRASH
        trash.mkdir(exist_ok=True, mode=0o700)
        target = trash / uuid.uuid4().hex
        os.rename(path, target)
        threading.Thread(target=_delete, args=(target,), name="tessera-trash",
                         daemon=True).start()

    def empty_trash(self) -> None:
        """What a previous run left in the trash (a daemon stopped while deleting), deleted
        in the background."""
        trash = self.root / TRASH
        if trash.is_dir():
            for p in trash.iterdir():
                threading.Thread(target=_delete, args=(p,), name="tessera-trash",
                                 daemon=True).start()

    def records(self) -> list[AllocationRecord]:
        """Every allocation on disk. A directory without its record is one an Allocate is
        writing (or a daemon killed inside Allocate left: no container was given it) and is
        left out; a record that cannot be read is an error."""
        out = []
        for d in sorted(self.root.iterdir()):
            if d.name == TRASH or not d.is_dir() or not (d / META).exists():
                continue
            meta = json.loads((d / META).read_text())
            out.append(AllocationRecord(
                key=d.name, resource=meta["resource"], device_ids=tuple(meta["device_ids"]),
                units=tuple(meta["units"]), created=float(meta["created"]),
            ))
        return out


def _delete(path: Path) -> None:
    """``shutil.rmtree`` (which never follows a symlink a container left inside)."""
    try:
        shutil.rmtree(path)
    except OSError as exc:
        log.warning("cannot remove a container's old files", extra={
            "path": str(path), "error": str(exc)})
