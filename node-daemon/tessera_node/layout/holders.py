"""Which pods hold which GPUs and MIG devices, as the MIG enactor asks before it destroys an
instance, resets a GPU or switches its MIG mode: a pod that holds a device is using it even
while no process runs on it yet.

The device plugin answers (:class:`tessera_node.deviceplugin.held.HeldDevices`: what the
kubelet's PodResources API last said, and the allocations it has not confirmed yet); without
the device plugin no pod holds a device of tessera's (:class:`NoHolders`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

Holders = Mapping[str, Sequence[str]]
"""Device ID (``GPU-…`` or ``MIG-…`` UUID) -> pods (``namespace/name``) holding it."""


class DeviceHolders(Protocol):
    def holders(self) -> Holders:
        """Device ID -> pods holding it. Blocking (runs in a worker thread); raises OSError
        when the kubelet cannot be asked (the daemon then treats every device as held: fail
        closed)."""
        ...


class NoHolders:
    """No device plugin of tessera's on this node: no pod holds a device it advertised."""

    def holders(self) -> Holders:
        return {}
