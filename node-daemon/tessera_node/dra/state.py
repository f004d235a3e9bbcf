"""What this node's GPUs offer DRA now (any thread): the GPUs as NVML last showed them and
how the node's GPUPartitions share them (the reconciler hands both in after every pass),
less what the MIG enactor withdrew.

A withdrawal holds until NVML shows the GPU as the enactor left it: ``changed(gpu)`` comes
from the enactor's thread when its commands are done, and only a snapshot whose read began
after that releases the GPU's withdrawn devices. A snapshot read while the commands ran
still shows the instances they destroy; publishing them again would offer claims a device
that is gone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tessera.api.inventory import GPUInventory
from tessera.dra.partitions import Bounds
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Sharing
from tessera_node.dra.decide import Pool, offered, placements, wanted
from tessera_node.node.inventory import node_gpus


class DraDevices:
    def __init__(self, shares_per_unit: int,
                 clock: Callable[[], float] = time.monotonic,
                 reserved_known: bool = True) -> None:
        """``reserved_known``: False where the kubelet plugin's live resizes may have taken
        capacity (a daemon with ``--dra``): nothing is published until :meth:`reserve` says
        how much, so a restarted daemon never offers capacity a resize holds."""
        self.shares_per_unit = shares_per_unit
        self.clock = clock
        self._lock = threading.Lock()
        self._reserved: dict[str, tuple[int, int]] | None = {} if reserved_known else None
        """Unit UUID -> (bytes, cores) live resizes took beyond their claims' allocations."""
        self._snapshot: DeviceSnapshot | None = None
        self._readable = False
        self._sharing: Mapping[str, Sharing] = {}
        self._withdrawn: dict[str, set[str]] = {}
        """GPU UUID -> devices withdrawn from it (the GPU's own UUID: the whole GPU)."""
        self._changed_at: dict[str, float] = {}
        """GPU UUID -> when the enactor said its layout changed (withdrawn until a read)."""
        self._on_demand: Mapping[str, Bounds] = {}
        """GPU UUID -> its partition's bounds, for the GPUs in migMode OnDemand."""
        self._partitionable = False
        """Whether the API server keeps shared counters (the publisher finds out)."""

    def update(self, snapshot: DeviceSnapshot | None, read_at: float,
               sharing: Mapping[str, Sharing],
               on_demand: Mapping[str, Bounds] | None = None) -> None:
        """What NVML showed in the read begun at ``read_at`` (this clock; None: NVML
        unreadable now, every unit withdrawn), how the partitions share the GPUs, and which
        are on demand (with their bounds)."""
        with self._lock:
            self._on_demand = dict(on_demand or {})
            if snapshot is not None:
                self._snapshot, self._readable = snapshot, True
                for gpu, at in list(self._changed_at.items()):
                    if read_at > at:
                        del self._changed_at[gpu]
                        self._withdrawn.pop(gpu, None)
            else:
                self._readable = False
            self._sharing = dict(sharing)

    def devices(self) -> list[dict[str, Any]] | None:
        """The devices to publish now, less the placements of GPUs on demand; None before
        NVML was first read or before the reservations are known (nothing is known: what is
        published stays)."""
        with self._lock:
            return self._devices()

    def _devices(self) -> list[dict[str, Any]] | None:
        if self._snapshot is None or self._reserved is None:
            return None
        return wanted(self._snapshot, self._readable, self._withdrawn, self.shares_per_unit,
                      self._sharing, self._reserved, self._on_demand)

    def pool(self) -> Pool | None:
        """Everything to publish now, from one state: :meth:`devices`, then the placements
        of the GPUs on demand and their counter sets; None as for :meth:`devices`."""
        with self._lock:
            devices = self._devices()
            if devices is None or self._snapshot is None:
                return None
            extra = placements(self._snapshot, self._readable, self._withdrawn,
                               self._on_demand, self._partitionable)
        return Pool(devices + extra.devices, extra.counter_sets)

    def set_partitionable(self, kept: bool) -> bool:
        """Whether the API server keeps shared counters; whether that changed."""
        with self._lock:
            changed = kept != self._partitionable
            self._partitionable = kept
            return changed

    def on_demand_models(self) -> dict[int, tuple[str, str]]:
        """NVML index -> (GPU UUID, model ID) of the GPUs in migMode OnDemand with MIG on
        (where a claim's placement is made)."""
        with self._lock:
            if self._snapshot is None:
                return {}
            return {g.index: (g.uuid, g.model) for g in node_gpus(self._snapshot).gpus
                    if g.uuid in self._on_demand and g.mig_mode == "enabled"}

    def on_demand_gpus(self) -> tuple[list[int], bool]:
        """The indices of the GPUs in migMode OnDemand, and whether they can be published."""
        with self._lock:
            gpus = self._snapshot.gpus if self._snapshot is not None else ()
            return ([g.index for g in gpus if g.uuid in self._on_demand],
                    self._partitionable)

    def reserve(self, reserved: Mapping[str, tuple[int, int]]) -> bool:
        """What live resizes take now, per unit (bytes, cores); whether that changed."""
        with self._lock:
            new = {u: r for u, r in reserved.items() if r != (0, 0)}
            changed = new != self._reserved
            self._reserved = new
            return changed

    def gpus(self) -> tuple[GPUInventory, ...] | None:
        """The GPUs with the units offered now (what :meth:`devices` publishes); None before
        NVML was first read."""
        with self._lock:
            if self._snapshot is None:
                return None
            return offered(self._snapshot, self._readable, self._withdrawn,
                           self.shares_per_unit, self._sharing)

    def present(self) -> tuple[GPUInventory, ...] | None:
        """The GPUs with every unit NVML shows, withdrawn ones included: a claim allocated
        before its device was withdrawn is still prepared (the MIG change waits for it)."""
        with self._lock:
            if self._snapshot is None:
                return None
            return offered(self._snapshot, self._readable, {}, self.shares_per_unit,
                           self._sharing)

    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        with self._lock:
            self._withdrawn.setdefault(gpu_uuid, set()).update(devices)
            self._changed_at.pop(gpu_uuid, None)  # a new change: held until its own end

    def changed(self, gpu_uuid: str) -> None:
        with self._lock:
            if gpu_uuid in self._withdrawn:
                self._changed_at[gpu_uuid] = self.clock()

    def withdrawn(self) -> dict[str, frozenset[str]]:
        with self._lock:
            return {g: frozenset(d) for g, d in self._withdrawn.items()}
