"""Live resizes of the claims prepared on this node (I/O; the decisions are
:mod:`tessera_node.dra.resize`'s): the supervised task ``dra-resize`` on a DRA node.

On every change of the node's pods (and every ``poll_s``) it looks at the pods whose budgets
are DRA claims (no ``tessera.dev/budget``):

* ``tessera.dev/budget-resize`` ``Approved``: each claim of the pod prepared here gets the
  budget ``tessera.dev/claim-budget`` gives it; a growth is first reserved (the device's
  published capacity lowered, the slice stored) and checked against every claim allocated
  on the device, else refused.  The outcome is written on the pod (a merge patch conditional
  on its resourceVersion) with an Event, as for a device-plugin pod;
* otherwise only budgets that do not grow are applied (the operator rolled a refused resize
  back, or took a growth back): a growth is applied only when approved.

:meth:`ClaimResizer.republish` keeps the published capacity equal to what the prepared
claims' budgets take beyond their allocations (and a growth being decided), from any thread:
after the checkpoint is read, after every resize and every unprepare.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import replace

from tessera.api.claim_budget import ClaimBudgetError, parse_claim_budgets
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_CLAIM_BUDGET,
    NODE_DAEMON,
    REASON_RESIZE_REFUSED,
    REASON_RESIZED,
)
from tessera.api.resize import ResizeStatus
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.events import post_event
from tessera_node import metrics
from tessera_node.deviceplugin.node_pods import NodePods
from tessera_node.deviceplugin.resize import awaiting
from tessera_node.dra.claims import UnitBudget
from tessera_node.dra.publisher import SlicePublisher, WithdrawError
from tessera_node.dra.resize import (
    ClaimTarget,
    device_use,
    overcommitted,
    pod_targets,
    reserved,
    resized_message,
)
from tessera_node.dra.service import DraPlugin
from tessera_node.dra.state import DraDevices

log = logging.getLogger("tessera_node.dra")


class ClaimResizer:
    def __init__(self, kube: Kube, pods: NodePods, plugin: DraPlugin,
                 publisher: SlicePublisher, offer: DraDevices, wake: asyncio.Event,
                 poll_s: float) -> None:
        self.kube = kube
        self.pods = pods
        self.plugin = plugin
        self.publisher = publisher
        self.offer = offer
        self.wake = wake
        """Set on every change of the node's pods."""
        self.poll_s = poll_s
        self._pending: dict[str, tuple[UnitBudget, ...]] = {}
        """Claim UID -> a growing budget being decided (reserved, not applied yet)."""
        self._lock = threading.Lock()

    # -- the reservation -----------------------------------------------------------------------

    def republish(self) -> None:
        """Publish the capacity resizes take now (any thread); nothing before the prepared
        claims are read (until then nothing is published at all)."""
        checkpoint = self.plugin.checkpoint
        if checkpoint is None:
            return
        with self._lock:
            pending = dict(self._pending)
        if self.offer.reserve(reserved(checkpoint.claims(), pending)):
            self.publisher.refresh()

    def _set_pending(self, targets: Sequence[ClaimTarget], on: bool) -> None:
        with self._lock:
            for t in targets:
                if on:
                    self._pending[t.claim.uid] = t.units
                else:
                    self._pending.pop(t.claim.uid, None)
        self.republish()

    async def _hold(self, growing: Sequence[ClaimTarget]) -> str | None:
        """Reserve the growth and check it fits; None when it is held (still pending: the
        caller applies it), else why not (the reservation dropped)."""
        self._set_pending(growing, True)
        reason: str | None
        try:
            await self.publisher.settled()
            body = await self.kube.list(path("resource.k8s.io", "v1", "resourceclaims"))
        except (WithdrawError, ApiError, OSError) as exc:
            reason = f"on this node: the growth could not be reserved now ({exc}); ask again"
        else:
            checkpoint = self.plugin.checkpoint
            gpus = self.plugin.node.gpus() or ()
            with self._lock:
                pending = dict(self._pending)
            use = device_use(body.get("items") or [], self.plugin.opts.node_name, gpus,
                             checkpoint.claims() if checkpoint is not None else [], pending)
            reason = overcommitted(gpus, use, [u.uuid for t in growing for u in t.units])
        if reason is not None:
            self._set_pending(growing, False)
        return reason

    # -- the task ------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_s)
            self.wake.clear()
            await self.step()

    async def step(self) -> None:
        if self.plugin.preparer is None or self.plugin.checkpoint is None \
                or not self.pods.listed():
            return
        for key, obj in list(self.pods.objects.items()):
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if ANNOTATION_BUDGET in ann or (ANNOTATION_CLAIM_BUDGET not in ann
                                            and awaiting(ann) is None):
                continue  # the device plugin's, or nothing of a resize
            try:
                await self.answer(obj)
            except (ApiError, OSError) as exc:  # the next step tries again
                metrics.ERRORS.labels("dra").inc()
                log.warning("claim resize not answered", extra={
                    "pod": "/".join(key), "error": str(exc)[:300]})

    async def answer(self, pod: Obj) -> None:
        preparer, checkpoint = self.plugin.preparer, self.plugin.checkpoint
        assert preparer is not None and checkpoint is not None
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        status = awaiting(ann)
        try:
            targets = pod_targets(pod, checkpoint.claims())
            listed = parse_claim_budgets(ann.get(ANNOTATION_CLAIM_BUDGET))
        except ClaimBudgetError as exc:
            if status is not None:
                await self._decided(pod, replace(status, state="Refused",
                                                 reason=f"on this node: {exc}"), [])
            return
        if status is None:  # only what reserves no more: a rollback, a growth taken back
            for t in targets:
                if not t.reserves_more:
                    await asyncio.to_thread(preparer.rebudget, t.claim.uid, t.units)
            self.republish()
            return
        if any(checkpoint.get(uid) is None for uid in listed):
            return  # a claim of it not prepared here yet: decided once it is
        growing = [t for t in targets if t.reserves_more]
        if growing:
            reason = await self._hold(growing)
            if reason is not None:
                await self._decided(pod, replace(status, state="Refused", reason=reason), [])
                return
        try:
            for t in targets:
                await asyncio.to_thread(preparer.rebudget, t.claim.uid, t.units)
            for uid in set(listed) - {t.claim.uid for t in targets}:  # its file, again
                record = checkpoint.get(uid)
                if record is not None:
                    await asyncio.to_thread(preparer.rebudget, uid, record.units)
        finally:
            self._set_pending(growing, False)
        await self._decided(pod, ResizeStatus(status.request, "Applied"), targets)

    async def _decided(self, pod: Obj, status: ResizeStatus,
                       targets: Sequence[ClaimTarget]) -> None:
        meta = pod["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        metrics.API_WRITES.labels("pod").inc()
        try:
            await self.kube.merge_patch(path("", "v1", "pods", ns, name), {"metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ANNOTATION_BUDGET_RESIZE: status.to_annotation()}}})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            return  # gone, or changed: decided again from what it says then
        metrics.RESIZES.labels(status.state).inc()
        log.info("claim budget resize decided", extra={
            "pod": f"{ns}/{name}", "state": status.state, "reason": status.reason})
        if status.state == "Applied":
            await post_event(self.kube, pod, "v1", "Pod", REASON_RESIZED,
                             resized_message(targets), "Normal", NODE_DAEMON)
        else:
            await post_event(self.kube, pod, "v1", "Pod", REASON_RESIZE_REFUSED,
                             f"budget request refused: {status.reason}", "Warning", NODE_DAEMON)
