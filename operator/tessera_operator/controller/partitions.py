"""GPUPartitions, the leader's part: which nodes and GPUs each selects and claims, whether
its layout fits them, each node's report copied into its status, its conditions, and the
finalizer of ``deletionPolicy: Reset`` partitions (the rules: :mod:`tessera.partition`).

Level-triggered: every partition or node event marks the work dirty; the loop recomputes
every partition's status from the caches and writes only what differs, once per burst of
reports.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tessera.api.conditions import READY
from tessera.api.inventory import NodeInventory, from_node
from tessera.api.names import FINALIZER_RESET, GPUPARTITIONS, GROUP, LABEL_GPU_PRODUCT, VERSION
from tessera.api.partition import GPUPartitionSpec, GPUPartitionStatus, NodePartitionStatus
from tessera.kube.client import ApiError, Kube, Obj, follow, path
from tessera.kube.health import Health
from tessera.kube.merge import merge_diff
from tessera.partition import PartitionView, aggregate, resolve
from tessera_operator import metrics
from tessera_operator.controller.events import conditions, dump, post_transitions

log = logging.getLogger("tessera_operator.controller.partitions")

STATUS_KEYS = ("observedGeneration", "conditions", "selectedNodes", "selectedNodeCount",
               "readyNodeCount", "layout", "nodes")
"""All of a GPUPartition's status but ``demand`` (the placement service's, MIG on demand):
the operator is its only writer."""


@dataclass
class PartitionController:
    kube: Kube
    component: str = "tessera-operator"
    health: Health | None = None
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    partitions: dict[str, Obj] = field(default_factory=dict)
    nodes_synced: bool = False
    """The node watch has listed: until then no node looks selected, and a deleting Reset
    partition must not lose its finalizer for want of nodes."""
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)

    def forget(self) -> None:
        """Leadership lost: the next leadership rebuilds from its own watches."""
        self.partitions.clear()

    def on_partition(self, typ: str | None, body: Mapping[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        if typ == "DELETED":
            self.partitions.pop(name, None)
        else:
            self.partitions[name] = dict(body)
        metrics.WATCHED.labels("gpupartition").set(len(self.partitions))
        self._dirty.set()

    def on_node(self, typ: str, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        if typ == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self._dirty.set()
            return
        inv = from_node(node)
        if self.nodes.get(name) != inv:
            self.nodes[name] = inv
            self._dirty.set()
        metrics.WATCHED.labels("node").set(len(self.nodes))

    def on_node_sync(self, items: list[Obj]) -> None:
        self.nodes = {str(n["metadata"]["name"]): from_node(n) for n in items}
        self.nodes_synced = True
        metrics.WATCHED.labels("node").set(len(self.nodes))
        self._dirty.set()

    def _views(self) -> tuple[list[PartitionView], dict[str, GPUPartitionStatus],
                              dict[str, Obj]]:
        """Each partition's view, stored status and the body both were read from."""
        views, olds, bodies = [], {}, {}
        for name, body in sorted(self.partitions.items()):
            meta, status = body["metadata"], body.get("status") or {}
            try:
                spec = GPUPartitionSpec.model_validate(body.get("spec") or {})
            except ValidationError as exc:
                log.warning("invalid GPUPartition spec", extra={"partition": name,
                                                               "error": str(exc)})
                continue
            entries: dict[str, NodePartitionStatus] = {}
            for node, inv in self.nodes.items():
                entry = inv.report(name)
                if entry is not None:
                    entries[node] = entry
            views.append(PartitionView(name, spec, int(meta.get("generation") or 1),
                                       str(meta.get("creationTimestamp") or ""), entries))
            olds[name] = GPUPartitionStatus(conditions=conditions(status.get("conditions")))
            bodies[name] = body
        return views, olds, bodies

    async def reconcile_partitions(self) -> None:
        views, olds, bodies = self._views()
        resolutions = resolve(views, self.nodes.values())
        for v in views:
            if v.name not in self.partitions:
                continue
            # the body the view was made from, not a newer one that arrived during this
            # pass: a view of generation 1 judged with a body marked for deletion (generation
            # 2) saw the nodes' generation-1 reports as the reset done and dropped the Reset
            # finalizer before any daemon acted. A newer body marks the work dirty; its own
            # pass follows, and writes carry this body's resourceVersion (409 if stale).
            body = bodies[v.name]
            new = aggregate(v, resolutions[v.name], olds[v.name])
            await self._deletion_policy(body, v, new)
            wire = new.to_dict()
            stored = body.get("status") or {}
            want = {k: wire.get(k) for k in STATUS_KEYS}
            have = {k: stored.get(k) for k in STATUS_KEYS if k in stored}
            have["conditions"] = dump(olds[v.name].conditions)
            # a merge patch merges objects: deselected nodes, and fields a node's report
            # no longer has (a cleared message), must be nulled explicitly
            diff = merge_diff(have, want)
            if diff == {}:
                continue
            patch = {"status": diff}
            try:
                await self.kube.merge_patch(
                    path(GROUP, VERSION, GPUPARTITIONS, name=v.name) + "/status", patch)
                metrics.STATUS_WRITES.labels("gpupartition", "reconcile").inc()
            except ApiError as exc:
                if exc.status != 404:
                    raise
                continue
            await post_transitions(self.kube, body, "GPUPartition", olds[v.name].conditions,
                                   new.conditions, self.component)

    async def _deletion_policy(self, body: Obj, v: PartitionView,
                               new: GPUPartitionStatus) -> None:
        """Reset: hold a finalizer until the daemons report the GPUs reset.

        Deleting sets deletionTimestamp and bumps the generation; node daemons then enact
        MIG disabled on the partition's GPUs and report phase Ready at that generation, and
        the partition goes once every node holding its GPUs has (or none is selected).
        Retain (the default) never gets a finalizer: nothing to wait for, nothing written.
        """
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        has = FINALIZER_RESET in finalizers
        deleting = meta.get("deletionTimestamp") is not None
        reset = v.spec.deletion_policy == "Reset"
        ready = next((c for c in new.conditions if c.type == READY), None)
        done = ready is not None and (ready.status == "True" or ready.reason ==
                                      "NoNodesSelected")
        if reset and not deleting and not has:
            finalizers.append(FINALIZER_RESET)
        elif has and (not reset or (deleting and done and self.nodes_synced)):
            finalizers.remove(FINALIZER_RESET)
        else:
            return
        try:
            await self.kube.merge_patch(path(GROUP, VERSION, GPUPARTITIONS, name=v.name), {
                "metadata": {"resourceVersion": meta.get("resourceVersion"),
                             "finalizers": finalizers}})
            log.info("finalizer updated", extra={
                "partition": v.name, "finalizers": finalizers, "deleting": deleting,
                "reset": reset, "ready": None if ready is None else ready.reason,
                "nodesSynced": self.nodes_synced})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            self._dirty.set()  # a newer version is on its way

    async def loop(self) -> None:
        while True:
            await self._dirty.wait()
            # Trailing debounce: when a layout changes, every selected node's report arrives
            # within a short burst; write each partition's status once the burst pauses for
            # 50 ms (at most 1 s late) instead of once per report.
            started = asyncio.get_running_loop().time()
            while True:
                self._dirty.clear()
                await asyncio.sleep(0.05)
                if (not self._dirty.is_set()
                        or asyncio.get_running_loop().time() - started > 1.0):
                    break
            self._dirty.clear()
            try:
                await self.reconcile_partitions()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("partition reconcile failed", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
                self._dirty.set()

    async def watch_nodes(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.on_node_sync(obj.get("items") or [])
            else:
                self.on_node(typ, obj)
        await follow(self.kube.watch(path("", "v1", "nodes"), LABEL_GPU_PRODUCT, name="nodes",
                                     health=self.health), handle, "nodes")

