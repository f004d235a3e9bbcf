"""What the webhooks decide: budgets and tessera's quota check for pods, checks for the CRs.

A pod's budget is filled in and written by the mutating webhook, which also checks it
against the namespace's per-pod ``max`` and against every GPUQuota's ``hard`` and
``status.used`` from this replica's cache, and refuses with tessera's message (what is over,
by how much, which quota) when it clearly does not fit.  It writes nothing to the API
server: the race-free count is the API server's own, against the ResourceQuota each
GPUQuota manages (:mod:`tessera_operator.quota.managed`), which refuses what tessera's check let
through on a count a moment old -- and while that count cannot be kept (the ResourceQuota
gone, not tessera's, holding other limits) the webhook refuses every GPU pod of the
namespace itself, saying why.

What a user may not write is removed from every pod it admits: the keys of
:func:`tessera.api.writers.tessera_only_pod_keys` (the budget and its label, a resize's
outcome, a growth holder's label), then the budget is written anew.  Growth holders
(:mod:`tessera_operator.quota.holders`) pass unchanged, and only when the operator itself creates
them.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tessera.api.duration import parse_duration
from tessera.api.inventory import from_node
from tessera.api.names import (
    ANNOTATION_BUDGET,
    GPU_POD,
    GPUPARTITIONS,
    GPUQUOTAS,
    GROUP,
    GROWTH_HOLDER_PREFIX,
    LABEL_BUDGETED,
    LABEL_GPU_PRODUCT,
    LABEL_GROWTH_OF,
    PREFIX,
    QUOTA_REQUESTS_PREFIX,
    VERSION,
    VGPU_MEMORY,
)
from tessera.api.partition import GPUPartitionSpec
from tessera.api.quota import IDLE_WARN_AFTER_S
from tessera.api.writers import tessera_only_pod_keys
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.partition import PartitionView, resolve, spec_errors
from tessera.placement.policy import PolicyError
from tessera.placement.policy import parse as parse_policy
from tessera_operator import metrics
from tessera_operator.cache.managed import ManagedQuotaCache
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.quota import managed
from tessera_operator.quota.arith import (
    PodRequestError,
    Usage,
    budget_from_pod,
    check_fit,
    deny_message,
)
from tessera_operator.quota.claims import (
    CapacityNotStated,
    ClaimRequestError,
    claim_ask,
    claim_note,
    device_asks,
    fill_capacity,
    filled_spec,
    mig_limit_of,
    over_max,
)
from tessera_operator.quota.holders import claim_holder_pod, is_holder
from tessera_operator.quota.objects import FieldError, policy_of, view_of
from tessera_operator.quota.status import over_hard
from tessera_operator.webhooks import pod_security

DEFAULT_SCHEDULER = "default-scheduler"

log = logging.getLogger("tessera.admission")

def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def allow(uid: str, patch: list[dict[str, Any]] | None = None,
          warnings: list[str] | None = None) -> Obj:
    out: Obj = {"uid": uid, "allowed": True}
    if patch:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        out["warnings"] = warnings
    return out


def deny(uid: str, message: str, code: int = 403) -> Obj:
    reason = {403: "Forbidden", 409: "AlreadyExists", 422: "Invalid"}.get(code, "BadRequest")
    return {"uid": uid, "allowed": False,
            "status": {"code": code, "reason": reason, "message": message}}


def pod_patch(pod: Mapping[str, Any], annotation: str | None
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """Remove every key a user may not write, then write the budget annotation and its label
    (none when ``annotation`` is None); and a warning for each key the pod carried that is
    not what tessera writes now."""
    meta = pod.get("metadata") or {}
    want = {("annotations", ANNOTATION_BUDGET): annotation,
            ("labels", LABEL_BUDGETED): None if annotation is None else "true"}
    ops: list[dict[str, Any]] = []
    warnings: list[str] = []
    for section, kind in (("annotations", "annotation"), ("labels", "label")):
        raw = meta.get(section)
        present: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        exists = isinstance(raw, Mapping)
        for key in tessera_only_pod_keys(kind):  # type: ignore[arg-type]
            value = want.get((section, key))
            if key in present and present[key] != value:
                warnings.append(f"metadata.{section}[{key}] removed: it is written only by "
                                f"tessera")
            if value is None:
                if key in present:
                    ops.append({"op": "remove", "path": f"/metadata/{section}/{_esc(key)}"})
            elif present.get(key) == value:
                continue
            elif not exists:
                ops.append({"op": "add", "path": f"/metadata/{section}", "value": {key: value}})
                exists = True
            else:
                ops.append({"op": "add", "path": f"/metadata/{section}/{_esc(key)}",
                            "value": value})
    return ops, warnings


def counter_patch(spec: Mapping[str, Any], gpu_pod: bool
                  ) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """``tessera.dev/pod``: 1 on the first app container of a GPU pod (what the managed
    ResourceQuota counts GPU pods by), nowhere else; what to fill into that container (for
    :func:`fill_patch`) and the removals elsewhere."""
    fill: dict[str, int] = {}
    ops: list[dict[str, Any]] = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            first = gpu_pod and kind == "containers" and i == 0
            res = c.get("resources") or {}
            if first:
                lim, req = (res.get("limits") or {}).get(GPU_POD), (res.get("requests")
                                                                    or {}).get(GPU_POD)
                if str(lim) != "1" or (req is not None and str(req) != "1"):
                    fill[GPU_POD] = 1
                continue
            for section in ("limits", "requests"):
                if GPU_POD in (res.get(section) or {}):
                    ops.append({"op": "remove", "path": f"/spec/{kind}/{i}/resources/"
                                f"{section}/{_esc(GPU_POD)}"})
    return fill, ops


def fill_patch(spec: Mapping[str, Any], filled: Mapping[str, Mapping[str, int]]
               ) -> list[dict[str, Any]]:
    """Add the filled-in resources to the containers' limits (and requests, if they list
    tessera resources: an extended resource's request must equal its limit)."""
    ops: list[dict[str, Any]] = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(kind) or []):
            add = filled.get(str(c.get("name")))
            if not add:
                continue
            values = {k: str(v) for k, v in add.items()}
            base = f"/spec/{kind}/{i}/resources"
            res = c.get("resources")
            if not res:
                ops.append({"op": "add", "path": base, "value": {"limits": values}})
                continue
            for section in ("limits", "requests"):
                have = res.get(section)
                if section == "requests" and not any(
                        k.startswith(PREFIX) for k in (have or {})):
                    continue
                if not have:
                    ops.append({"op": "add", "path": f"{base}/{section}", "value": values})
                else:
                    ops.extend({"op": "add", "path": f"{base}/{section}/{_esc(k)}", "value": v}
                               for k, v in values.items())
    return ops


@dataclass
class Admission:
    """Pod and CR admission (every replica serves it)."""

    kube: Kube
    quotas: QuotaCache
    managed: ManagedQuotaCache
    operator_user: str | None = None
    """The operator's own user name (its ServiceAccount): the only creator of holders."""
    scheduler_name: str = ""
    """When set, GPU pods that name no scheduler of their own get this one (tessera's)."""
    holder_image: str = "registry.k8s.io/pause:3.10"
    """The image of growth and claim holders (never pulled: they are never scheduled)."""

    # -- pods ---------------------------------------------------------------------------
    #
    # One mutating webhook (reinvoked when a later mutating webhook changes the pod, so the
    # budget it writes always matches the pod as stored): defaults filled in, the per-pod
    # max and tessera's quota check, the budget annotation and label written.  No API call.

    async def mutate_pod(self, req: Mapping[str, Any]) -> Obj:
        return await self._timed("pods", self._mutate, req)

    async def _mutate(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        pod = req.get("object") or {}
        if is_holder(pod):
            user = str((req.get("userInfo") or {}).get("username") or "")
            if self.operator_user is not None and user == self.operator_user:
                return allow(uid)
            return deny(uid, f"pods named {GROWTH_HOLDER_PREFIX}… or labelled {LABEL_GROWTH_OF} "
                             f"are tessera's growth holders: only the operator creates them")
        ns = _namespace(req)
        quotas = await self.quotas.quotas(ns)
        try:
            budget = budget_from_pod(pod.get("spec") or {},
                                     policy_of([self.quotas.view(q) for q in quotas]))
        except (PodRequestError, FieldError) as exc:
            return deny(uid, str(exc))
        spec = pod.get("spec") or {}
        if not budget.requests_anything:
            ops, warnings = pod_patch(pod, None)
            return allow(uid, counter_patch(spec, False)[1] + ops, warnings)
        escapes = pod_security.problems(spec)
        if escapes:
            return deny(uid, pod_security.refusal(escapes))
        try:
            parse_policy((pod.get("metadata") or {}).get("annotations") or {})
        except PolicyError as exc:
            return deny(uid, f"{exc} (fix the annotation or remove it for the cluster's "
                             "default)")
        if req.get("operation", "CREATE") == "CREATE":
            violations = check_fit(budget.usage(), [self.quotas.view(q) for q in quotas])
            if violations:
                return deny(uid, deny_message(violations))
            unenforced = await self._unenforced(ns, quotas)
            if unenforced:
                return deny(uid, unenforced)
        filled = {c.name: dict(c.filled) for c in budget.containers if c.filled}
        fill, removals = counter_patch(spec, True)
        if fill:
            first = str(((spec.get("containers") or [{}])[0]).get("name", ""))
            filled.setdefault(first, {}).update(fill)
        ops, warnings = pod_patch(pod, budget.annotation())
        return allow(uid, fill_patch(spec, filled) + removals + ops
                     + pod_security.seccomp_patch(spec) + self._scheduler_patch(spec),
                     warnings)

    def _scheduler_patch(self, spec: Mapping[str, Any]) -> list[Obj]:
        """Hand the pod to tessera's scheduler unless it names another one (the API server
        has defaulted an unset name to ``default-scheduler`` before admission)."""
        if not self.scheduler_name or spec.get("schedulerName") not in (
                None, "", DEFAULT_SCHEDULER, self.scheduler_name):
            return []
        if spec.get("schedulerName") == self.scheduler_name:
            return []
        return [{"op": "add", "path": "/spec/schedulerName", "value": self.scheduler_name}]

    async def _unenforced(self, ns: str, quotas: list[Obj], what: str = "GPU pods"
                          ) -> str | None:
        """Why a GPUQuota of the namespace is not counted by the API server now, if one
        is not: every GPU pod of the namespace is refused until it is."""
        for q in sorted(quotas, key=lambda q: str(q["metadata"]["name"])):
            name = str(q["metadata"]["name"])
            rq = await self.managed.lookup(ns, managed.managed_name(name))
            problem = managed.enforcement(q, self.quotas.view(q).readable_limits, rq)
            if problem is None:
                continue
            why = problem[1]
            for c in (q.get("status") or {}).get("conditions") or []:
                if c.get("type") == "Ready" and c.get("reason") in managed.REASONS:
                    why = str(c.get("message") or why)  # the leader knows more (e.g. whose)
            return (f'GPUQuota "{name}" cannot be enforced now: {why}. {what[:1].upper()}'
                    f"{what[1:]} of this namespace are refused until it counts again; retry "
                    f"in a few seconds")
        return None

    # -- ResourceClaims (the DRA path) ---------------------------------------------------
    #
    # A claim or claim template asking tessera's DeviceClasses, in a namespace with a
    # GPUQuota: the mutating webhook states each request's capacity (the GPUQuota's default
    # where the claim says nothing), refuses what cannot be counted or is over the per-pod
    # max, and checks a claim against every GPUQuota's hard (tessera's message).  The
    # validating webhook sees the claim as it will be stored -- after the API server dropped
    # the fields of features it has off -- and refuses one whose capacity is gone: a claim
    # whose share GPUQuota cannot count is never stored.  No API call; no GPUQuota in the
    # namespace: nothing counted (as for pods).

    async def mutate_claim(self, req: Mapping[str, Any]) -> Obj:
        return await self._timed("resourceclaims", self._mutate_claim, req)

    async def validate_claim(self, req: Mapping[str, Any]) -> Obj:
        return await self._timed("resourceclaims", self._validate_claim, req)

    async def _mutate_claim(self, req: Mapping[str, Any]) -> Obj:
        return await self._review_claim(req, mutating=True)

    async def _validate_claim(self, req: Mapping[str, Any]) -> Obj:
        return await self._review_claim(req, mutating=False)

    async def _timed(self, what: str, review: Callable[[Mapping[str, Any]], Awaitable[Obj]],
                     req: Mapping[str, Any]) -> Obj:
        started = time.perf_counter()
        result = "error"
        try:
            resp: Obj = await review(req)
            result = "allowed" if resp["allowed"] else "denied"
            return resp
        finally:
            metrics.ADMISSION_SECONDS.labels(what, result).observe(time.perf_counter() - started)

    async def _claim_policy(self, req: Mapping[str, Any]
                            ) -> tuple[Mapping[str, Any], str, str, list[Obj]] | None:
        """The claim spec under review, its field path and JSON pointer, and the namespace's
        GPUQuotas; None when it asks nothing of tessera or no GPUQuota counts it."""
        obj = req.get("object") or {}
        template = (req.get("kind") or {}).get("kind") == "ResourceClaimTemplate"
        outer = obj.get("spec") or {}
        spec = (outer.get("spec") or {}) if template else outer
        where, pointer = ("spec.spec", "/spec/spec") if template else ("spec", "/spec")
        if not isinstance(spec, Mapping) or not device_asks(spec, where, pointer):
            return None
        quotas = await self.quotas.quotas(_namespace(req))
        if not quotas:
            return None
        return spec, where, pointer, quotas

    async def _review_claim(self, req: Mapping[str, Any], mutating: bool) -> Obj:
        uid = str(req.get("uid", ""))
        found = await self._claim_policy(req)
        if found is None:
            return allow(uid)
        spec, where, pointer, quotas = found
        views = [self.quotas.view(q) for q in quotas]
        try:
            policy = policy_of(views)
            ops = fill_capacity(spec, policy, where, pointer) if mutating else []
            asked = claim_ask(filled_spec(spec, policy, where) if mutating else spec, where,
                              mig_limit_of(views))
        except CapacityNotStated as exc:
            if mutating:
                return deny(uid, str(exc))
            return deny(uid, f"{exc}. tessera's admission stated it and it is gone: the API "
                             f"server drops it while its DRAConsumableCapacity feature gate "
                             f"is off (Kubernetes 1.34 and 1.35 by default), so no claim can "
                             f"take a share of a device and a GPUQuota cannot count this one. "
                             f"Turn the gate on (kube-apiserver, kube-scheduler, kubelet), or "
                             f"ask for {VGPU_MEMORY} in the pod's limits instead")
        except (ClaimRequestError, FieldError) as exc:
            return deny(uid, str(exc))
        over = over_max(asked, policy)
        if over:
            return deny(uid, over)
        if (req.get("kind") or {}).get("kind") != "ResourceClaim" or req.get(
                "operation", "CREATE") != "CREATE":
            return allow(uid, ops)  # a template uses nothing until a claim is made from it
        violations = check_fit(asked, views)
        if violations:
            return deny(uid, deny_message(violations)
                        + claim_note(v.resource for v in violations))
        if mutating:
            return allow(uid, ops)
        unenforced = await self._unenforced(_namespace(req), quotas,
                                            "claims for tessera devices")
        if unenforced:
            return deny(uid, unenforced)
        if req.get("dryRun"):
            return allow(uid)  # a dry run holds nothing
        refused = await self._hold_claim(req, asked)
        return deny(uid, refused) if refused else allow(uid)

    async def _hold_claim(self, req: Mapping[str, Any], asked: Usage) -> str | None:
        """Hold the claim's capacity in the API server's count with a claim holder (the
        side effect of this webhook, ``sideEffects: NoneOnDryRun``): its quota admission
        decides, race-free against every pod create and every other claim, whether the
        claim fits.  None when held; else why the claim is refused."""
        meta = (req.get("object") or {}).get("metadata") or {}
        claim_uid = str(meta.get("uid") or "")
        if not claim_uid:
            return "the claim has no UID at admission; create it again"
        ns = _namespace(req)
        body = claim_holder_pod(ns, claim_uid, asked, self.holder_image)
        try:
            # within the API server's 10 s for this webhook, with time left to answer
            await self.kube.request("POST", path("", "v1", "pods", ns), body, timeout=6.0)
        except ApiError as exc:
            if exc.status == 409:  # made by an earlier call for the same claim
                return None
            if exc.status in (403, 422):
                metrics.CLAIM_HOLDER_WRITES.labels("refused").inc()
                note = claim_note(_QUOTA_RESOURCE.findall(exc.message))
                return (f"no room for the claim in the namespace's GPUQuota count now (the "
                        f"API server: {exc.message[:400]}){note}; delete claims or pods, or "
                        f"create it again when some have finished")
            return f"the claim's capacity could not be held now ({exc.message[:300]}); retry"
        except (OSError, TimeoutError) as exc:
            return f"the claim's capacity could not be held now ({exc}); retry"
        metrics.CLAIM_HOLDER_WRITES.labels("created").inc()
        log.info("claim holder created", extra={
            "namespace": ns, "claim": meta.get("name"), "claimUID": claim_uid,
            "memoryMiB": asked.memory_mib, "cores": asked.cores, "pods": asked.pods,
            "migInstances": dict(asked.mig)})
        return None

    # -- GPUPartition ---------------------------------------------------------------------

    async def review_partition(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        obj = req.get("object") or {}
        try:
            spec = GPUPartitionSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            return deny(uid, _pydantic_message("spec", exc), 422)
        errors = spec_errors(spec)
        if errors:
            return deny(uid, "; ".join(f"{f}: {r}" for f, r in errors), 422)
        try:
            warnings = await self._partition_warnings(obj, spec)
        except (ApiError, OSError) as exc:  # warnings are best effort
            log.warning("no partition warnings", extra={"error": str(exc)})
            warnings = []
        return allow(uid, warnings=warnings)

    async def _partition_warnings(self, obj: Mapping[str, Any],
                                  spec: GPUPartitionSpec) -> list[str]:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        nodes = (await self.kube.list(path("", "v1", "nodes"), LABEL_GPU_PRODUCT, cached=True)
                 ).get("items") or []
        parts = (await self.kube.list(path(GROUP, VERSION, GPUPARTITIONS),
                                      cached=True)).get("items") or []
        views = [PartitionView(name, spec, 1, str(meta.get("creationTimestamp") or "~"))]
        for p in parts:
            pname = str(p["metadata"]["name"])
            if pname == name:
                continue
            try:
                views.append(PartitionView(pname, GPUPartitionSpec.model_validate(p["spec"]), 1,
                                           str(p["metadata"].get("creationTimestamp", ""))))
            except (ValidationError, KeyError):
                continue
        res = resolve(views, [from_node(n) for n in nodes])[name]
        out = [f"node {pr.node}: {pr.message}" for pr in res.problems[:5]]
        if len(res.problems) > 5:
            out.append(f"… and {len(res.problems) - 5} more problems (see status)")
        return out

    # -- GPUQuota -------------------------------------------------------------------------

    async def review_quota(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        obj = req.get("object") or {}
        ns = str(req.get("namespace") or "")
        name = str((obj.get("metadata") or {}).get("name"))
        view = view_of(obj)
        if view.error is not None:
            return deny(uid, view.error.short, 422)
        warnings: list[str] = []
        others = [view_of(q) for q in (await self.kube.list(
            path(GROUP, VERSION, GPUQUOTAS, ns), cached=True)).get("items") or []
            if q["metadata"]["name"] != name]
        if view.carries_policy:
            holder = next((q for q in others if q.carries_policy), None)
            if holder is not None:
                return deny(uid, f"spec: only one GPUQuota per namespace may set default, max, "
                                 f"weight, lending or idle, and gpuquota/{holder.name} does",
                            422)
        idle = ((obj.get("spec") or {}).get("idle") or {}).get("after")
        if isinstance(idle, str) and parse_duration(idle) < IDLE_WARN_AFTER_S:
            warnings.append(f"spec.idle.after {idle} is under a minute: pods idle that long "
                            f"are acted on (measured every audit interval of the node daemons, "
                            f"10s by default)")
        for res, u, limit in over_hard(view.hard, view.used):
            warnings.append(f"spec.hard.{res} {limit} is below what admitted pods use now "
                            f"({u}): they keep running, new pods are refused")
        return allow(uid, warnings=warnings)


_QUOTA_RESOURCE = re.compile(re.escape(QUOTA_REQUESTS_PREFIX + PREFIX) + r"[A-Za-z0-9.+-]+")
"""A managed ResourceQuota's resource in the API server's refusal (``requests.tessera.dev/
pod=1``)."""


def _namespace(req: Mapping[str, Any]) -> str:
    pod = req.get("object") or {}
    return str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace", ""))


def _pydantic_message(prefix: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return f"{prefix}.{loc}: {first['msg']}" if loc else f"{prefix}: {first['msg']}"
