"""The Node's capacity of tessera's countable resources (``tessera.dev/vgpu-memory``,
``tessera.dev/vgpu-cores``), written with a merge patch of ``nodes/status`` when it differs
from what the device plugin's units give (``devices.vgpu_capacity``, pure)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tessera.kube.client import ApiError, Kube, Obj, path
from tessera_node import metrics
from tessera_node.deviceplugin.devices import DEFAULT_MAX_PODS, capacity_patch, vgpu_capacity
from tessera_node.deviceplugin.manager import NodeState

log = logging.getLogger("tessera_node.deviceplugin")


def max_pods(status: Mapping[str, Any]) -> int:
    """How many pods the kubelet may run (its Node's ``pods`` capacity)."""
    try:
        return int(str((status.get("capacity") or {}).get("pods")))
    except ValueError:
        return DEFAULT_MAX_PODS


async def write_capacity(kube: Kube, node_name: str, node: Obj, state: NodeState) -> None:
    """Write the capacity the units in ``state`` give on the daemon's own Node (``node`` as
    last seen), unless it has it already; a failed write is logged and counted (the next
    step tries again)."""
    status = node.get("status") or {}
    want = vgpu_capacity(state.units, state.sharing, max_pods(status))
    have = {k: v for k, v in (status.get("capacity") or {}).items() if k in want}
    have_alloc = {k: v for k, v in (status.get("allocatable") or {}).items() if k in want}
    if have == want and have_alloc == want:
        return
    metrics.API_WRITES.labels("node-status").inc()
    try:
        await kube.merge_patch(path("", "v1", "nodes", name=node_name, sub="status"),
                               capacity_patch(want))
    except ApiError as exc:
        metrics.ERRORS.labels("node-status").inc()
        log.warning("node capacity not written", extra={"error": str(exc)[:300]})
        return
    log.info("node capacity written", extra={"capacity": want})
