"""The node's answers to approved live resizes, written on the pods (I/O): for each pod of
the node whose ``tessera.dev/budget-resize`` is ``Approved``, the resource manager decides
(``Manager.resize``, over ``resize.decide_pod``) and this writes the outcome on the pod, with
an Event. The write is a merge patch conditional on the pod's resourceVersion: a pod that
changed meanwhile is decided again at the next step, from what it says then (deciding twice
gives the same files)."""

from __future__ import annotations

import asyncio
import logging

from tessera.api.names import NODE_DAEMON, REASON_RESIZE_REFUSED, REASON_RESIZED
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.events import post_event
from tessera_node import metrics
from tessera_node.deviceplugin.manager import Manager
from tessera_node.deviceplugin.matcher import pod_view
from tessera_node.deviceplugin.node_pods import NodePods
from tessera_node.deviceplugin.resize import awaiting, resized_message

log = logging.getLogger("tessera_node.deviceplugin")


async def answer_resizes(kube: Kube, pods: NodePods, manager: Manager) -> None:
    if not pods.listed():
        return
    for key, obj in list(pods.objects.items()):
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        if awaiting(ann) is None:
            continue
        try:
            view = pod_view(obj)
        except (KeyError, TypeError, ValueError):
            continue
        outcome = await asyncio.to_thread(manager.resize, view)
        if outcome is None:
            continue
        meta = obj["metadata"]
        metrics.API_WRITES.labels("pod").inc()
        try:
            await kube.merge_patch(path("", "v1", "pods", key[0], key[1]), {
                "metadata": {"resourceVersion": meta.get("resourceVersion"),
                             "annotations": outcome.annotation_patch()}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            continue  # gone, or changed: the watch brings it back if there is more
        metrics.RESIZES.labels(outcome.status.state).inc()
        log.info("budget resize decided", extra={
            "pod": "/".join(key), "state": outcome.status.state,
            "reason": outcome.status.reason})
        if outcome.applied and outcome.budget is not None:
            await post_event(kube, obj, "v1", "Pod", REASON_RESIZED,
                             resized_message(outcome.budget), "Normal", NODE_DAEMON)
        else:
            await post_event(kube, obj, "v1", "Pod", REASON_RESIZE_REFUSED,
                             f"budget request refused: {outcome.status.reason}",
                             "Warning", NODE_DAEMON)
