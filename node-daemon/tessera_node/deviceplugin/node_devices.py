"""What this node's GPUs offer the device plugin now: the GPUs as NVML last showed them, how
the node's GPUPartitions share them, less what the MIG enactor withdrew (any thread).

The reconciler hands in the GPUs and the sharing after every pass (``update``); the MIG
enactor, in a GPU's worker thread, withdraws the devices a command will take away before it
runs it and says when the GPU changed (the daemon's ``Advertiser``). Every change is handed
on at once (``on_change``: the resource manager and every plugin's device list).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Sharing, offered_units
from tessera_node.deviceplugin.manager import NodeState

log = logging.getLogger("tessera_node.deviceplugin")


class NodeDevices:
    def __init__(self, on_change: Callable[[], None] = lambda: None,
                 on_withdrawn: Callable[[], None] = lambda: None) -> None:
        """``on_change``: any change (the plugins serve it); ``on_withdrawn``: devices were
        withdrawn (the Node's inventory leaves them out; called from the enactor's thread)."""
        self.on_change = on_change
        self.on_withdrawn = on_withdrawn
        self._lock = threading.Lock()
        self._snapshot: DeviceSnapshot | None = None
        self._readable = False
        self._sharing: Mapping[str, Sharing] = {}
        self._profiles: frozenset[str] = frozenset()
        self._withdrawn: dict[str, set[str]] = {}
        """GPU UUID -> devices withdrawn from it (the GPU's own UUID: the whole GPU)."""

    def update(self, snapshot: DeviceSnapshot | None, sharing: Mapping[str, Sharing],
               profiles: frozenset[str]) -> None:
        """What NVML shows (None: NVML unreadable, every unit unhealthy) and how the node's
        partitions share their GPUs (GPU UUID -> Whole/Shares), their profiles."""
        with self._lock:
            if snapshot is not None:
                self._snapshot, self._readable = snapshot, True
            else:
                self._readable = False
            self._sharing, self._profiles = dict(sharing), profiles
        self.on_change()

    def read_once(self) -> bool:
        """Whether NVML has been read once since the daemon started."""
        with self._lock:
            return self._snapshot is not None

    def state(self) -> NodeState:
        """The units to hand out now (unhealthy while NVML cannot be read)."""
        with self._lock:
            if self._snapshot is None:
                return NodeState(sharing=self._sharing, profiles=self._profiles)
            found = offered_units(self._snapshot, self._withdrawn, self._readable)
            return NodeState(units=found, sharing=self._sharing, profiles=self._profiles)

    def withdrawn(self) -> dict[str, frozenset[str]]:
        """GPU UUID -> the devices withdrawn from it now (the inventory leaves them out too)."""
        with self._lock:
            return {g: frozenset(devs) for g, devs in self._withdrawn.items()}

    # -- the MIG enactor's Advertiser (a GPU's worker thread) ---------------------------------

    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        with self._lock:
            self._withdrawn.setdefault(gpu_uuid, set()).update(devices)
        self.on_change()
        self.on_withdrawn()
        log.info("devices withdrawn", extra={"gpu": gpu_uuid, "devices": list(devices)})

    def changed(self, gpu_uuid: str) -> None:
        with self._lock:
            self._withdrawn.pop(gpu_uuid, None)
        self.on_change()  # the daemon reads NVML next and calls update() with the new layout
