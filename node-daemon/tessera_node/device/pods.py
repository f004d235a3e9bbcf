"""Which pods hold which GPUs and MIG devices: the kubelet's PodResources API (``List`` on
``/var/lib/kubelet/pod-resources/kubelet.sock``; it has no Watch, so it is polled with NVML).

The daemon asks before it destroys an instance, resets or switches the MIG mode of a GPU: a
pod that holds a device is using it even while no process runs on it yet.  Until tessera's
device plugin hands out devices no pod can hold one of tessera's, so :class:`NoPods` (the
daemon's source today) reports nothing; the device plugin brings the gRPC client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol


class PodResources(Protocol):
    def holders(self) -> Mapping[str, Sequence[str]]:
        """Device ID (``GPU-…``/``MIG-…`` UUID) -> pods (``namespace/name``) holding it.
        Blocking (runs in a worker thread); raises OSError when the kubelet cannot be
        asked (the daemon then treats every device as held: fail closed)."""
        ...


class NoPods:
    """No device plugin of tessera's yet: no pod holds a device it advertised."""

    def holders(self) -> Mapping[str, Sequence[str]]:
        return {}
