"""An Allocate the daemon cannot answer for a fault of its own fails with a message the
kubelet shows in the pod's events (not gRPC's bare "Exception calling application"), counted
and logged."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tessera.api.names import VGPU
from tessera.kube.health import Health
from tessera_node import metrics
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.node_pods import NodePods
from tessera_node.deviceplugin.plugins import WaitingResource
from tessera_node.deviceplugin.server import AllocateError


class Broken:
    """A resource manager with a bug: every Allocate raises what no code path expects."""

    def allocate(self, resource: str, device_ids: Sequence[str]) -> Any:
        raise KeyError("units")


def test_a_fault_in_allocate_is_a_refusal_with_the_reason() -> None:
    pods = NodePods(kube=None, node_name="n1", health=Health())  # type: ignore[arg-type]
    res = WaitingResource(VGPU, lambda: Broken(), AllocationGate(), pods)  # type: ignore[arg-type,return-value]
    before = metrics.ERRORS.labels("device-plugin")._value.get()
    with pytest.raises(AllocateError, match=r"tessera-node failed answering Allocate "
                                            r"\(KeyError: 'units'\); its log"):
        res.allocate(["GPU-0::0"])
    assert metrics.ERRORS.labels("device-plugin")._value.get() == before + 1
