"""Live resize, the operator's part (I/O; the rules are :mod:`tessera_operator.quota.resize` and
:mod:`tessera_operator.quota.holders`).

On each event of a budgeted pod the leader looks at ``tessera.dev/budget-request``:

* a request not answered yet (its digest differs from the status's): planned against the
  namespace's per-pod ``max``; what grows is checked against every GPUQuota's ``hard`` and
  ``used`` (tessera's message), then held: the pod's growth holders are made to hold the
  larger of its growth before and after the resize, and the API server's quota admission
  decides, race-free against every create, whether that fits.  The pod then gets the new
  ``tessera.dev/budget`` and the status ``Approved`` (sealed: the previous budget and what
  grew) in one conditional write.  Refused (bad request, over ``max``, over ``hard``, no
  room in the API server's count): status ``Refused`` with the reason and a Warning Event;
  nothing else changes.
* a status the node daemon turned ``Refused`` while it carries a sealed ``previous``: the
  previous budget is restored (the holders already hold it).  A ``previous`` without a valid
  seal was not written by tessera: it is dropped, unread, with a Warning Event.

Applying (``Approved`` -> ``Applied``) is the node daemon's: it alone knows what else is
committed on the container's GPUs.  The holders follow each outcome (the controller settles
them to what the pod needs, :meth:`tessera_operator.controller.holders.Holders.settle`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api.budget import BudgetAnnotation, BudgetAnnotationError, parse_budget_annotation
from tessera.api.claim_budget import ClaimBudgetError, claim_budgets_text, parse_claim_budgets
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_REQUEST,
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_CLAIM_BUDGET,
    REASON_RESIZE_REFUSED,
)
from tessera.api.resize import ResizeStatus, digest
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.events import post_event
from tessera_operator import metrics
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.holders import Holders, owner_from
from tessera_operator.quota.arith import (
    TERMINAL_PHASES,
    Usage,
    annotation_usage,
    budget_from_pod,
    check_fit,
    claims_growth,
    deny_message,
    pod_counts,
    pod_usage,
    resource_usage,
    usage_of,
)
from tessera_operator.quota.claim_resize import claims_by_container, plan_claims
from tessera_operator.quota.holders import need
from tessera_operator.quota.objects import FieldError, policy_of
from tessera_operator.quota.resize import ResizeError, plan, usage_fields

log = logging.getLogger("tessera.resize")

REASON_RECORD_IGNORED = "BudgetResizeRecordIgnored"
REASON_GROWTH_TAKEN_BACK = "BudgetGrowthTakenBack"
CONFLICT_RETRIES = 3
"""How often an answer is decided again on the pod as it is now when the pod changed
between the copy it was decided on and its write (then the error is raised)."""


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


def pod_need(pod: Mapping[str, Any], key: bytes) -> Usage:
    """What the pod's growth holders must hold now: its growth beyond its limits, and while
    a resize waits for the node (or its refusal for the operator) the growth of the sealed
    previous budget too.  Zero once the pod no longer counts."""
    if not pod_counts(pod):
        return Usage()
    meta = pod.get("metadata") or {}
    limits = resource_usage(pod)
    status = ResizeStatus.parse((meta.get("annotations") or {}).get(ANNOTATION_BUDGET_RESIZE))
    previous = None
    if (status is not None and status.previous is not None
            and status.state in ("Approved", "Refused")
            and status.seal_holds(key, str(meta.get("uid") or ""))):
        try:
            previous = (claims_growth(parse_claim_budgets(status.previous)) if of_claims(pod)
                        else annotation_usage(status.previous, pod.get("spec") or {}))
        except (ValueError, TypeError, KeyError):
            previous = None
    return need(pod_usage(pod), limits, previous)


def of_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's budgets are DRA claims' (it was admitted with no
    ``tessera.dev/budget``: it asks no device of the device plugin's)."""
    return ANNOTATION_BUDGET not in ((pod.get("metadata") or {}).get("annotations") or {})


@dataclass
class Resizer:
    kube: Kube
    cache: QuotaCache
    holders: Holders
    key: bytes
    component: str = "tessera-operator"

    async def reconcile(self, pod: Obj) -> Obj | None:
        """Answer the pod's resize work; the pod as written (or as it is now, when another
        write answered it meanwhile), if it was.

        Every answer is a conditional write on the copy it was decided on.  When the pod
        changed meanwhile (409: the scheduler, the kubelet or the user wrote it), the answer
        is decided again on the pod as it is now, at once and under the caller's lock: what
        the holders hold for it stays held.  Leaving that to the pod's next event let the
        holders settle in between -- a holder made for the growth was deleted and made
        again -- and every holder deleted while pods are created makes kube-controller-
        manager recount the namespace from a cache that can lack the newest pods (one pod
        over ``hard`` in 1 of 8 trials on Kubernetes 1.34)."""
        for _ in range(CONFLICT_RETRIES):
            try:
                return await self._answer(pod)
            except ApiError as exc:
                if exc.status != 409:
                    raise
            meta = pod["metadata"]
            try:
                pod = await self.kube.get(_pod_url(str(meta["namespace"]), str(meta["name"])))
            except ApiError as exc:
                if exc.status == 404:
                    return None
                raise
            if not pending_request(pod):
                return pod
        return await self._answer(pod)

    async def _answer(self, pod: Obj) -> Obj | None:
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        uid = str(meta.get("uid") or "")
        status = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
        if status is not None and status.state == "Refused" and status.previous is not None:
            if not status.seal_holds(self.key, uid):
                return await self._ignore_record(pod, status)
            return await self._roll_back(pod, status)
        if of_claims(pod):
            return await self._answer_claims(pod)
        ns = str(meta["namespace"])
        spec = pod.get("spec") or {}
        quotas = await self.cache.quotas(ns)
        req = str(ann.get(ANNOTATION_BUDGET_REQUEST) or "")
        tag = digest(req)
        try:
            current = parse_budget_annotation(str(ann.get(ANNOTATION_BUDGET) or ""))
            p = plan(current, req, policy_of([self.cache.view(q) for q in quotas]), spec)
        except (ResizeError, BudgetAnnotationError, FieldError) as exc:
            return await self._refuse(pod, ResizeStatus(tag, "Refused", str(exc)))
        refused = await self._hold_growth(pod, p.grow, quotas, tag, lambda: need(
            usage_of(p.budget, spec), resource_usage(pod), usage_of(current, spec)))
        if refused:
            return await self._refuse(pod, ResizeStatus(tag, "Refused", refused))
        approved = ResizeStatus(tag, "Approved", previous=str(ann.get(ANNOTATION_BUDGET)),
                                grow=usage_fields(p.grow)).sealed(self.key, uid)
        # changed meanwhile (409) or gone: raised; what was held is settled from the pod
        written = await self.kube.merge_patch(_pod_url(ns, str(meta["name"])), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_BUDGET: p.budget.to_annotation(),
                            ANNOTATION_BUDGET_RESIZE: approved.to_annotation()}}})
        log.info("budget resize approved", extra={"namespace": ns, "pod": meta["name"]})
        return written

    async def _answer_claims(self, pod: Obj) -> Obj | None:
        """:meth:`_answer` for a pod of DRA claims (:mod:`tessera_operator.quota.claim_resize`):
        the same checks and holders, the new budgets in ``tessera.dev/claim-budget``."""
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        ns, uid = str(meta["namespace"]), str(meta.get("uid") or "")
        quotas = await self.cache.quotas(ns)
        req = str(ann.get(ANNOTATION_BUDGET_REQUEST) or "")
        tag = digest(req)
        claims = {}
        for name in sorted({n for names in claims_by_container(pod).values() for n in names}):
            try:
                claims[name] = await self.kube.get(path("resource.k8s.io", "v1",
                                                        "resourceclaims", ns, name))
            except ApiError as exc:
                if exc.status != 404:
                    raise
                return await self._refuse(pod, ResizeStatus(tag, "Refused", (
                    f"ResourceClaim {name} of this pod does not exist (any more)")))
        previous = str(ann.get(ANNOTATION_CLAIM_BUDGET) or "{}")
        try:
            current = parse_claim_budgets(previous)
            p = plan_claims(pod, req, claims, current,
                            policy_of([self.cache.view(q) for q in quotas]))
        except (ResizeError, ClaimBudgetError, FieldError) as exc:
            return await self._refuse(pod, ResizeStatus(tag, "Refused", str(exc)))
        refused = await self._hold_growth(pod, p.grow, quotas, tag, lambda: need(
            claims_growth(p.budgets), Usage(), claims_growth(current)))
        if refused:
            return await self._refuse(pod, ResizeStatus(tag, "Refused", refused))
        approved = ResizeStatus(tag, "Approved", previous=previous,
                                grow=usage_fields(p.grow)).sealed(self.key, uid)
        written = await self.kube.merge_patch(_pod_url(ns, str(meta["name"])), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_CLAIM_BUDGET: claim_budgets_text(p.budgets),
                            ANNOTATION_BUDGET_RESIZE: approved.to_annotation()}}})
        log.info("claim budget resize approved", extra={"namespace": ns, "pod": meta["name"]})
        return written

    async def _hold_growth(self, pod: Obj, grow: Usage, quotas: list[Obj], tag: str,
                           want: Callable[[], Usage]) -> str | None:
        """Check what grows against every GPUQuota's ``hard`` and ``used``, then have the pod's
        growth holders hold ``want()`` (the API server's count decides); why not, or None."""
        if not (grow.memory_mib or grow.cores):
            return None
        refused = deny_message(check_fit(grow, [self.cache.view(q) for q in quotas]))
        if refused:
            return refused
        try:
            held = await self.holders.hold(owner_from(pod), want(), tag)
        except ApiError as exc:  # no answer about the growth: the user may ask again
            return f"the growth could not be held now ({exc.message[:300]}); ask again"
        if held is not None:
            return (f"no room to grow in the namespace's GPUQuota count now (the API server: "
                    f"{held}); ask again when pods have finished")
        return None

    async def _roll_back(self, pod: Obj, status: ResizeStatus) -> Obj:
        meta = pod["metadata"]
        done = ResizeStatus(status.request, "Refused", status.reason)
        budget_key = ANNOTATION_CLAIM_BUDGET if of_claims(pod) else ANNOTATION_BUDGET
        written = await self.kube.merge_patch(_pod_url(meta["namespace"], meta["name"]), {
            "metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "annotations": {budget_key: status.previous,
                                         ANNOTATION_BUDGET_RESIZE: done.to_annotation()}}})
        log.info("budget resize rolled back", extra={
            "namespace": meta["namespace"], "pod": meta["name"], "reason": status.reason})
        return written

    async def _ignore_record(self, pod: Obj, status: ResizeStatus) -> Obj:
        """A record asking to restore a budget tessera did not seal: dropped unread."""
        meta = pod["metadata"]
        reason = (f"a {ANNOTATION_BUDGET_RESIZE} record tessera did not write (its seal does "
                  f"not match) was ignored; ask for a resize with {ANNOTATION_BUDGET_REQUEST}")
        kept = ResizeStatus(status.request, "Refused", reason)
        written = await self.kube.merge_patch(_pod_url(meta["namespace"], meta["name"]), {
            "metadata": {"resourceVersion": meta.get("resourceVersion"),
                         "annotations": {ANNOTATION_BUDGET_RESIZE: kept.to_annotation()}}})
        await post_event(self.kube, pod, "v1", "Pod", REASON_RECORD_IGNORED, reason,
                         "Warning", self.component)
        log.warning("unsealed resize record ignored", extra={
            "namespace": meta["namespace"], "pod": meta["name"]})
        return written

    async def _refuse(self, pod: Obj, status: ResizeStatus) -> Obj:
        meta = pod["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        written = await self.kube.merge_patch(_pod_url(ns, name), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {ANNOTATION_BUDGET_RESIZE: status.to_annotation()}}})
        await post_event(self.kube, pod, "v1", "Pod", REASON_RESIZE_REFUSED,
                         f"budget request refused: {status.reason}", "Warning", self.component)
        log.info("budget resize refused", extra={"namespace": ns, "pod": name,
                                                 "reason": status.reason})
        return written

    async def take_back(self, pod: Obj, why: str) -> Obj:
        """The pod's growth can no longer be held: its budget goes back to its limits."""
        meta = pod["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        ann = meta.get("annotations") or {}
        request = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
        if of_claims(pod):  # each claim back to what its allocation took
            reason = (f"the growth beyond the claims' allocations is no longer held in the "
                      f"GPUQuota count ({why}): their budgets are back to their allocations")
            back = {ANNOTATION_CLAIM_BUDGET: claim_budgets_text({})}
        else:
            reason = (f"the growth beyond the pod's limits is no longer held in the GPUQuota "
                      f"count ({why}): its budget is back to its limits")
            back = {ANNOTATION_BUDGET: limits_budget(pod).to_annotation()}
        status = ResizeStatus(request.request if request else digest(""), "Refused", reason)
        written = await self.kube.merge_patch(_pod_url(ns, name), {"metadata": {
            "resourceVersion": meta.get("resourceVersion"),
            "annotations": {**back, ANNOTATION_BUDGET_RESIZE: status.to_annotation()}}})
        metrics.GROWTH_TAKEN_BACK.inc()
        await post_event(self.kube, pod, "v1", "Pod", REASON_GROWTH_TAKEN_BACK, reason,
                         "Warning", self.component)
        log.warning("growth taken back", extra={"namespace": ns, "pod": name, "why": why})
        return written


def limits_budget(pod: Mapping[str, Any]) -> BudgetAnnotation:
    """The budget the pod's own limits give (what admission wrote; the webhook filled every
    default into the limits), with the current budget's quota, weight and lending."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    admitted = budget_from_pod(pod.get("spec") or {}).to_api()
    try:
        current = parse_budget_annotation(str(ann.get(ANNOTATION_BUDGET) or ""))
    except BudgetAnnotationError:
        return admitted
    return admitted.model_copy(update={"quota": current.quota, "weight": current.weight,
                                       "lending": current.lending})


def _pod_url(ns: str, name: str) -> str:
    return path("", "v1", "pods", ns, name)

