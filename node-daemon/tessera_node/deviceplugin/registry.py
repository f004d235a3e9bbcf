"""The containers tessera set up on this node: one entry per allocation its device plugin
confirmed for a container (pod UID, container, budget, budget file and ledger, units). The
DRA plugin's prepared claims take the same shape (:mod:`tessera_node.dra.containers`) and
are read beside it.

The device plugin's manager writes it (``put`` when a container's budget file is written
ready or refused, ``drop`` when its files are removed); the rest of the daemon (the audit and
its per-container metrics, the core controllers) only reads ``snapshot()``. Thread-safe: the
manager runs in gRPC and worker threads, readers in the event loop and worker threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera.api.budget import PerShareBudget
from tessera_node.budget.writer import LEDGER


@dataclass(frozen=True)
class SetUpContainer:
    key: str
    """The allocation's key (its directory under ``<state dir>/containers``)."""
    pod_uid: str
    namespace: str
    pod: str
    container: str
    resource: str
    """``tessera.dev/vgpu`` or ``tessera.dev/mig-<profile>``."""
    units: tuple[str, ...]
    """The GPU (``GPU-…``) or MIG instance (``MIG-…``) UUIDs the container sees, in order."""
    gpus: tuple[str, ...]
    """The UUID of the GPU of each unit (the same as the unit for a whole GPU)."""
    budget: PerShareBudget | None
    """The budget from the pod's annotation; None when the container was refused."""
    refused: str | None
    """Why the container's budget file is refused (no GPU memory), or None."""
    budget_file: str
    ledger_dir: str
    quota: str | None = None
    """The GPUQuota (``namespace/name``) the pod's budget came from, if any."""
    weight: int = 1
    """The quota's fair-share weight for idle core time."""
    lending: bool = True
    """False: the quota's hard caps (its containers neither lend nor borrow core time)."""
    container_id: str | None = None
    """The runtime's ID of the container now (the pod's status, written by the kubelet;
    ``containerd://`` stripped), once it has started: the audit holds each process of a pod
    with several GPU containers to the budget of the container its cgroup names."""
    claim: str | None = None
    """``namespace/name`` of the DRA ResourceClaim this entry is (the DRA plugin's entries:
    one per prepared claim, its budget shared by every container that uses it); None for a
    container the device plugin set up."""
    other_pod_uids: tuple[str, ...] = ()
    """A claim's other pods (beside ``pod_uid``) whose processes are the claim's."""

    @property
    def ledger(self) -> Path:
        """Its ledger on the host (mounted at ``/run/tessera/ledger`` in the container)."""
        return Path(self.ledger_dir) / LEDGER


class ContainerRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, SetUpContainer] = {}

    def put(self, entry: SetUpContainer) -> None:
        with self._lock:
            self._by_key[entry.key] = entry

    def drop(self, key: str) -> None:
        with self._lock:
            self._by_key.pop(key, None)

    def identify(self, ids: Mapping[tuple[str, str], str]) -> None:
        """The runtime's container IDs, by (pod UID, container name), as the pods' statuses
        say now; an entry whose container has none (not started yet) keeps what it had."""
        with self._lock:
            for key, e in self._by_key.items():
                cid = ids.get((e.pod_uid, e.container))
                if cid and cid != e.container_id:
                    self._by_key[key] = dataclasses.replace(e, container_id=cid)

    def snapshot(self) -> list[SetUpContainer]:
        """Every container set up now, by namespace, pod and container name."""
        with self._lock:
            entries = list(self._by_key.values())
        return sorted(entries, key=lambda e: (e.namespace, e.pod, e.container, e.key))
