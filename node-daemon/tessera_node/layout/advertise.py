"""What this node advertises to the kubelet, as far as MIG changes are concerned.

Before the daemon destroys a MIG instance, resets a GPU or switches its MIG mode it
withdraws the devices that go away, so that no pod is given one in the meantime; after a
GPU's layout changed it says so, and what is there is advertised again.  tessera's device
plugin (a later part) implements this; until then :class:`NothingAdvertised` stands in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Advertiser(Protocol):
    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        """Stop advertising ``devices`` (GPU or MIG UUIDs) of that GPU; blocking, returns
        once the kubelet was told."""
        ...

    def changed(self, gpu_uuid: str) -> None:
        """That GPU's layout changed: advertise what it has now."""
        ...


class NothingAdvertised:
    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        return None

    def changed(self, gpu_uuid: str) -> None:
        return None
