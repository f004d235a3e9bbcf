"""Live resize, the operator's part (I/O; the rules are :mod:`tessera.quota.resize`).

On each event of a budgeted pod the leader looks at ``tessera.dev/budget-request``:

* a request not answered yet (its digest differs from the status's): planned against the
  namespace's per-pod ``max``; what grows is reserved in every GPUQuota of the namespace
  (a reservation keyed ``<pod UID>/resize-<digest>``: the next count, which sees the pod,
  confirms it from the new annotation); the pod then gets the new ``tessera.dev/budget`` and
  status ``Approved`` (with the previous budget and what was reserved) in one conditional
  write, and what shrank is released. Refused: status ``Refused`` with the reason and a
  Warning Event; nothing changes.
* a status the node daemon turned ``Refused`` while it still carries ``previous``: the
  previous budget is restored and what was reserved is given back.

Applying (``Approved`` -> ``Applied``) is the node daemon's: it alone knows what else is
committed on the container's GPUs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from tessera.api.budget import BudgetError, parse_budget
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_REQUEST,
    ANNOTATION_BUDGET_RESIZE,
    REASON_RESIZE_REFUSED,
)
from tessera.api.resize import ResizeStatus, digest
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.events import post_event
from tessera.quota.arith import TERMINAL_PHASES, deny_message
from tessera.quota.batch import Release, Reserve
from tessera.quota.ledger import expires_at
from tessera.quota.objects import FieldError, policy_of
from tessera.quota.resize import ResizeError, plan, usage_fields, usage_from_fields
from tessera.reservations.store import QuotaStore

log = logging.getLogger("tessera.resize")


def pending_request(pod: Mapping[str, Any]) -> bool:
    """Whether this pod has resize work for the operator (cheap: no parsing of budgets)."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
        return False
    status = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
    if status is not None and status.state == "Refused" and status.previous is not None:
        return True
    req = ann.get(ANNOTATION_BUDGET_REQUEST)
    if not isinstance(req, str) or not req:
        return False
    return status is None or status.request != digest(req)


async def reconcile_resize(kube: Kube, store: QuotaStore, pod: Obj, component: str,
                           create_deadline_s: float = 70.0) -> None:
    meta = pod["metadata"]
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta.get("uid") or "")
    ann = meta.get("annotations") or {}
    status = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
    quotas = await store.quotas(ns)
    if status is not None and status.state == "Refused" and status.previous is not None:
        await _roll_back(kube, store, pod, status, ns, name, uid)
        return
    req = str(ann.get(ANNOTATION_BUDGET_REQUEST) or "")
    tag = digest(req)
    try:
        current = parse_budget(str(ann.get(ANNOTATION_BUDGET) or ""))
        p = plan(current, req, policy_of(quotas), pod.get("spec") or {})
    except (ResizeError, BudgetError, FieldError) as exc:
        await _refuse(kube, pod, ResizeStatus(tag, "Refused", str(exc)), component)
        return
    key = f"{uid}/resize-{tag}"  # pending until the pod is seen with its new budget
    if p.grow.memory_mib or p.grow.cores:
        refused = await store.reserve(ns, quotas, Reserve(
            key, name, p.grow, expires_at(time.time(), create_deadline_s)))
        if refused:
            await _refuse(kube, pod, ResizeStatus(tag, "Refused", deny_message(refused)),
                          component)
            return
    approved = ResizeStatus(tag, "Approved", previous=str(ann.get(ANNOTATION_BUDGET)),
                            grow=usage_fields(p.grow))
    try:
        await kube.merge_patch(_pod_url(ns, name), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_BUDGET: p.budget.to_annotation(),
                            ANNOTATION_BUDGET_RESIZE: approved.to_annotation()}}})
    except ApiError:
        # changed meanwhile (or gone): give the reservation back; the next event decides
        if p.grow.memory_mib or p.grow.cores:
            for q in quotas:
                await store.release(ns, str(q["metadata"]["name"]), Release(key, None))
        raise
    if p.shrink.memory_mib or p.shrink.cores:
        for q in quotas:
            await store.release(ns, str(q["metadata"]["name"]),
                                Release(f"{uid}/resize-{tag}", p.shrink))
    log.info("budget resize approved", extra={"namespace": ns, "pod": name})


async def _roll_back(kube: Kube, store: QuotaStore, pod: Obj, status: ResizeStatus,
                     ns: str, name: str, uid: str) -> None:
    meta = pod["metadata"]
    done = ResizeStatus(status.request, "Refused", status.reason)
    await kube.merge_patch(_pod_url(ns, name), {"metadata": {
        "resourceVersion": meta.get("resourceVersion"),
        "annotations": {ANNOTATION_BUDGET: status.previous,
                        ANNOTATION_BUDGET_RESIZE: done.to_annotation()}}})
    grow = usage_from_fields(status.grow or {})
    if grow.memory_mib or grow.cores:
        for q in await store.quotas(ns):
            await store.release(ns, str(q["metadata"]["name"]),
                                Release(f"{uid}/rollback-{status.request}", grow))
    log.info("budget resize rolled back", extra={"namespace": ns, "pod": name,
                                                 "reason": status.reason})


async def _refuse(kube: Kube, pod: Obj, status: ResizeStatus, component: str) -> None:
    meta = pod["metadata"]
    ns, name = str(meta["namespace"]), str(meta["name"])
    await kube.merge_patch(_pod_url(ns, name), {"metadata": {
        "resourceVersion": meta.get("resourceVersion"),
        "annotations": {ANNOTATION_BUDGET_RESIZE: status.to_annotation()}}})
    await post_event(kube, pod, "v1", "Pod", REASON_RESIZE_REFUSED,
                     f"budget request refused: {status.reason}", "Warning", component)
    log.info("budget resize refused", extra={"namespace": ns, "pod": name,
                                             "reason": status.reason})


def _pod_url(ns: str, name: str) -> str:
    return path("", "v1", "pods", ns, name)
