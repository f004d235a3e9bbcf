"""What the audit needs to know of the containers tessera set up on this node.

The device plugin's side keeps the registry (which pod and container each allocation
belongs to, once confirmed); the audit only reads it, through :class:`ContainerRegistry`:
any object with a ``snapshot()`` of entries that have the attributes of :class:`SetUp`
will do (structural typing), so the device plugin's own registry plugs in as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

LEDGER_FILE = "ledger"
"""The ledger's name inside a container's ledger directory (``/run/tessera/ledger``)."""


class SetUp(Protocol):
    """One container tessera's device plugin set up, its pod confirmed. An entry may also
    carry ``container_id`` (the runtime's ID, ``containerd://`` stripped): it makes the match
    of a process to a container of a pod with several GPU containers exact."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def pod_uid(self) -> str: ...

    @property
    def container(self) -> str: ...

    @property
    def units(self) -> tuple[str, ...]:
        """The GPU (``GPU-…``) or MIG (``MIG-…``) UUIDs it was given."""
        ...

    @property
    def budget_file(self) -> str:
        """Its budget file on the host."""
        ...

    @property
    def ledger_dir(self) -> str:
        """Its ledger directory on the host (mounted at /run/tessera in the container)."""
        ...


class ContainerRegistry(Protocol):
    def snapshot(self) -> Sequence[SetUp]:
        """Every container tessera set up on this node now (thread-safe)."""
        ...


def ledger_path(c: SetUp) -> Path:
    return Path(c.ledger_dir) / LEDGER_FILE


def container_id(c: SetUp) -> str | None:
    cid = getattr(c, "container_id", None)
    return cid if isinstance(cid, str) and cid else None


@dataclass(frozen=True)
class TesseraContainer:
    """A plain :class:`SetUp` (standalone use and tests)."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    budget_file: str
    ledger_dir: str
    units: tuple[str, ...]
    container_id: str | None = None


class NoContainers:
    """No device plugin: tessera set up no container, so every GPU process is foreign."""

    def snapshot(self) -> Sequence[SetUp]:
        return ()


class StaticRegistry:
    """A fixed, replaceable list (standalone use and tests)."""

    def __init__(self, containers: Sequence[SetUp] = ()) -> None:
        self.items: list[SetUp] = list(containers)

    def snapshot(self) -> Sequence[SetUp]:
        return tuple(self.items)
