"""The Reset finalizer is decided from one version of a partition: a body marked for
deletion that arrives while the leader is writing another partition's status is not judged
with the view made from its previous version (whose nodes' reports looked current)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from tessera.api.inventory import GPUInventory, node_labels, to_annotation
from tessera.api.names import ANNOTATION_PARTITION_STATUS, FINALIZER_RESET
from tessera.api.node_report import to_annotation as reports_annotation
from tessera.api.partition import NodePartitionStatus
from tessera_operator.controller.partitions import PartitionController


def partition(name: str, node: str, gen: int = 1, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "generation": gen, "resourceVersion": str(gen),
                            "creationTimestamp": "2026-11-27T00:00:00Z",
                            "finalizers": [FINALIZER_RESET]}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T01:00:00Z"
    return {"metadata": meta, "spec": {
        "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
        "layout": {"profiles": [{"name": "3g.40gb", "count": 2}]}, "deletionPolicy": "Reset"}}


def node(name: str, part: str) -> dict[str, Any]:
    inv = [GPUInventory(index=0, uuid=f"GPU-{name}", model="H100-80GB", memory_mib=81559)]
    return {"metadata": {"name": name, "labels": {**node_labels(inv),
                                                  "kubernetes.io/hostname": name},
                         "annotations": {"tessera.dev/gpus": to_annotation(inv),
                                         ANNOTATION_PARTITION_STATUS: reports_annotation(
                                             {part: NodePartitionStatus(
                                                 phase="Ready", observed_generation=1)})}}}


class Kube:
    """Records writes; the first status write lets a deletion of ``b`` arrive meanwhile."""

    def __init__(self, ctl: PartitionController) -> None:
        self.ctl = ctl
        self.finalizer_writes: list[tuple[str, Any]] = []

    async def merge_patch(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        if url.endswith("/status") and "/a" in url:
            self.ctl.on_partition("MODIFIED", partition("b", "n-b", gen=2, deleting=True))
            await asyncio.sleep(0)
        if "finalizers" in (body.get("metadata") or {}):
            self.finalizer_writes.append((url, copy.deepcopy(body)))
        return {}

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {}


def test_a_deletion_arriving_mid_pass_does_not_drop_the_reset_finalizer() -> None:
    ctl = PartitionController(kube=None)  # type: ignore[arg-type]
    kube = Kube(ctl)
    ctl.kube = kube  # type: ignore[assignment]
    ctl.on_node_sync([node("n-a", "a"), node("n-b", "b")])
    ctl.on_partition(None, partition("a", "n-a"))
    ctl.on_partition(None, partition("b", "n-b"))
    asyncio.run(ctl.reconcile_partitions())
    removed = [w for w in kube.finalizer_writes
               if w[1]["metadata"]["finalizers"] == [] and w[0].endswith("/b")]
    assert removed == [], json.dumps(kube.finalizer_writes)
    # the next pass sees b at generation 2: its node's generation-1 report is not a reset
    kube.finalizer_writes.clear()
    asyncio.run(ctl.reconcile_partitions())
    assert not [w for w in kube.finalizer_writes if w[1]["metadata"]["finalizers"] == []]
