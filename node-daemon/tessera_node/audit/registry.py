"""What the audit needs to know of the containers tessera set up on this node.

The device plugin's side keeps the registry (which pod and container each allocation
belongs to, once confirmed); the audit only reads it through :class:`ContainerRegistry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

LEDGER_FILE = "ledger"
"""The ledger's name inside a container's ledger directory (``/run/tessera/ledger``)."""


@dataclass(frozen=True)
class TesseraContainer:
    """One container tessera's device plugin set up, its pod confirmed."""

    namespace: str
    pod: str
    pod_uid: str
    container: str
    budget_path: Path
    """Its budget file on the host (GPU-/MIG- UUIDs, memory and core budgets)."""
    ledger_dir: Path
    """Its ledger directory on the host (mounted at /run/tessera in the container)."""
    units: tuple[str, ...]
    """The GPU (``GPU-…``) or MIG (``MIG-…``) UUIDs it was given."""
    container_id: str | None = None
    """The runtime's container ID (``containerd://`` stripped), when known: it makes the
    match of a process to a container of a pod with several GPU containers exact."""

    @property
    def ledger_path(self) -> Path:
        return self.ledger_dir / LEDGER_FILE


class ContainerRegistry(Protocol):
    def containers(self) -> Sequence[TesseraContainer]:
        """Every container tessera set up on this node now (blocking; may read files)."""
        ...


class NoContainers:
    """No device plugin yet: tessera set up no container, so every GPU process is foreign."""

    def containers(self) -> Sequence[TesseraContainer]:
        return ()


class StaticRegistry:
    """A fixed, replaceable list (standalone use and tests)."""

    def __init__(self, containers: Sequence[TesseraContainer] = ()) -> None:
        self.items: list[TesseraContainer] = list(containers)

    def containers(self) -> Sequence[TesseraContainer]:
        return tuple(self.items)
