"""Live resize, the operator's part (I/O; the rules are :mod:`tessera.quota.resize`).

On each event of a budgeted pod the leader looks at ``tessera.dev/budget-request``:

* a request not answered yet (its digest differs from the status's): planned against the
  namespace's per-pod ``max``; what grows is checked against every GPUQuota's ``hard`` and
  ``used`` (tessera's message), then the ResourceQuota each GPUQuota manages is lowered by
  the pod's new growth beyond its limits (:mod:`tessera.quota.managed`): its growth record
  and ``spec.hard`` first, then ``status.hard`` -- what the API server's quota admission
  compares against -- in a write conditional on the ``status.used`` it checked, so no pod
  admitted meanwhile can pass the lowered hard.  The pod then gets the new
  ``tessera.dev/budget`` and status ``Approved`` (with the previous budget and what grew) in
  one conditional write; a shrink raises the ResourceQuotas' hard after it.  Refused: status
  ``Refused`` with the reason and a Warning Event; nothing changes.
* a status the node daemon turned ``Refused`` while it still carries ``previous``: the
  previous budget is restored and the growth record follows it.

Applying (``Approved`` -> ``Applied``) is the node daemon's: it alone knows what else is
committed on the container's GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from tessera import metrics
from tessera.api.budget import BudgetError, parse_budget
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_REQUEST,
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_RESIZE_GROWTH,
    REASON_RESIZE_REFUSED,
)
from tessera.api.resize import ResizeStatus, digest
from tessera.cache.quotas import QuotaCache
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.events import post_event
from tessera.quota import managed
from tessera.quota.arith import (
    TERMINAL_PHASES,
    Usage,
    check_fit,
    deny_message,
    parse_budget_annotation,
    resource_usage,
    usage_of,
)
from tessera.quota.objects import FieldError, policy_of, readable_limits
from tessera.quota.resize import ResizeError, plan, usage_fields

log = logging.getLogger("tessera.resize")

MAX_ATTEMPTS = 20
"""Conflicting writes of a ResourceQuota's status (pods admitted meanwhile) before a resize
gives up and is refused (the user may ask again)."""

Managed = dict[tuple[str, str], Obj]


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


async def reconcile_resize(kube: Kube, cache: QuotaCache, rqs: Managed, pod: Obj,
                           component: str) -> None:
    meta = pod["metadata"]
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta.get("uid") or "")
    ann = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    status = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
    quotas = await cache.quotas(ns)
    asked = resource_usage(pod)
    if status is not None and status.state == "Refused" and status.previous is not None:
        await _roll_back(kube, rqs, quotas, pod, status, asked)
        return
    req = str(ann.get(ANNOTATION_BUDGET_REQUEST) or "")
    tag = digest(req)
    try:
        current = parse_budget(str(ann.get(ANNOTATION_BUDGET) or ""))
        p = plan(current, req, policy_of(quotas), spec)
    except (ResizeError, BudgetError, FieldError) as exc:
        await _refuse(kube, pod, ResizeStatus(tag, "Refused", str(exc)), component)
        return
    old_growth = managed.grown(usage_of(current, spec), asked)
    new_growth = managed.grown(usage_of(p.budget, spec), asked)
    if p.grow.memory_mib or p.grow.cores:
        refused = deny_message(check_fit(p.grow, [cache.view(q) for q in quotas]))
        if not refused:
            refused = await set_growth(kube, rqs, ns, quotas, uid, new_growth, old_growth,
                                       lower=True) or ""
        if refused:
            await _refuse(kube, pod, ResizeStatus(tag, "Refused", refused), component)
            return
    approved = ResizeStatus(tag, "Approved", previous=str(ann.get(ANNOTATION_BUDGET)),
                            grow=usage_fields(p.grow))
    try:
        await kube.merge_patch(_pod_url(ns, name), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_BUDGET: p.budget.to_annotation(),
                            ANNOTATION_BUDGET_RESIZE: approved.to_annotation()}}})
    except ApiError:
        # changed meanwhile (or gone): the growth goes back; the next event decides
        if p.grow.memory_mib or p.grow.cores:
            await set_growth(kube, rqs, ns, quotas, uid, old_growth, new_growth)
        raise
    if new_growth != old_growth and not (p.grow.memory_mib or p.grow.cores):
        await set_growth(kube, rqs, ns, quotas, uid, new_growth, old_growth)
    log.info("budget resize approved", extra={"namespace": ns, "pod": name})


async def set_growth(kube: Kube, rqs: Managed, ns: str, quotas: list[Obj], uid: str,
                     growth: Usage, before: Usage, lower: bool = False) -> str | None:
    """Record the pod's growth on every managed ResourceQuota of the namespace, with its
    hard.  ``lower``: the hard goes down, and must go down in ``status.hard`` at once
    without passing what is in use; when it cannot, every record goes back to ``before``
    and the reason is returned."""
    done: list[Obj] = []
    for q in sorted(quotas, key=lambda q: str(q["metadata"]["name"])):
        try:
            hard = await _record(kube, rqs, ns, q, uid, growth)
        except ApiError as exc:
            if exc.status == 404:
                continue  # not created yet: it will be, from the pods as they are then
            raise
        if lower:
            over = await _lower_status(kube, _managed_url(ns, q), hard)
            if over:
                for other in [q, *done]:
                    await _record(kube, rqs, ns, other, uid, before)
                return (f'exceeded GPUQuota "{q["metadata"]["name"]}": pods admitted since '
                        f"its last count leave no room to grow ({'; '.join(over)}); ask again")
        done.append(q)
    return None


def _managed_url(ns: str, quota: Obj) -> str:
    return path("", "v1", "resourcequotas", ns,
                managed.managed_name(str(quota["metadata"]["name"])))


async def _record(kube: Kube, rqs: Managed, ns: str, quota: Obj, uid: str,
                  growth: Usage) -> dict[str, str]:
    """Write the pod's growth into the record of the ResourceQuota ``quota`` manages and
    into its spec.hard; the hard."""
    url = _managed_url(ns, quota)
    limits = readable_limits(quota)
    key = (ns, str(quota["metadata"]["name"]))
    rq = await kube.get(url)
    record = managed.growth_of(rq)
    record[uid] = growth
    hard = managed.hard_of(limits, managed.total_growth(record))
    rqs[key] = await kube.merge_patch(url, {
        "metadata": {"annotations": {
            ANNOTATION_RESIZE_GROWTH: managed.growth_annotation(record)}},
        "spec": {"hard": {**{k: None for k in (rq.get("spec") or {}).get("hard") or {}
                             if k not in hard}, **hard}}})
    return hard


async def _lower_status(kube: Kube, url: str, hard: Mapping[str, str]) -> list[str]:
    """Lower ``status.hard`` to ``hard``, conditional on the ``status.used`` checked against
    it: what is in use beyond it (empty: written, or nothing enforced yet)."""
    for _ in range(MAX_ATTEMPTS):
        rq = await kube.get(url)
        status = rq.get("status") or {}
        if not status.get("hard"):
            return []  # the quota controller has not synced it: it admits no GPU pod yet
        over = managed.lowered_fits(rq, hard)
        if over:
            return over
        try:
            await kube.replace(url + "/status", {**rq, "status": {**status, "hard": dict(hard)}})
            metrics.MANAGED_QUOTA_WRITES.labels("lowered").inc()
            return []
        except ApiError as exc:
            if exc.status != 409:
                raise
    return [f"{MAX_ATTEMPTS} conflicting writes"]


async def _roll_back(kube: Kube, rqs: Managed, quotas: list[Obj], pod: Obj,
                     status: ResizeStatus, asked: Usage) -> None:
    meta = pod["metadata"]
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta.get("uid") or "")
    done = ResizeStatus(status.request, "Refused", status.reason)
    await kube.merge_patch(_pod_url(ns, name), {"metadata": {
        "resourceVersion": meta.get("resourceVersion"),
        "annotations": {ANNOTATION_BUDGET: status.previous,
                        ANNOTATION_BUDGET_RESIZE: done.to_annotation()}}})
    try:
        previous = parse_budget_annotation(str(status.previous), pod.get("spec") or {})
    except (ValueError, TypeError, KeyError):
        previous = None
    if previous is not None:
        await set_growth(kube, rqs, ns, quotas, uid, managed.grown(previous, asked), Usage())
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
