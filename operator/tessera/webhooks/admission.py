"""What the webhooks decide: budgets + quota reservation for pods, checks for the CRs.

A pod's budget is filled in and written by the mutating webhook; the validating webhook,
which sees the pod's UID, checks that the pod must fit every GPUQuota of its namespace and
reserves its usage under that UID (:mod:`tessera.quota.ledger`), written by
:class:`tessera.reservations.store.QuotaStore` (at the leader, when another replica leads:
:mod:`tessera.reservations.forwarding`).  A server-side dry run checks everything and
reserves nothing.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tessera import metrics
from tessera.api.budget import PodBudget, parse_budget
from tessera.api.inventory import from_node
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_RELEASED,
    GPUPARTITIONS,
    GPUQUOTAS,
    GROUP,
    LABEL_BUDGETED,
    LABEL_GPU_PRODUCT,
    PREFIX,
    VERSION,
)
from tessera.api.partition import GPUPartitionSpec
from tessera.api.quota import GPUQuotaSpec
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.partition import PartitionView, resolve, spec_errors
from tessera.quota.arith import (
    Budget,
    BudgetError,
    Usage,
    Violation,
    budget_from_pod,
    check_fit,
    deny_message,
)
from tessera.quota.batch import Release, Reserve
from tessera.quota.ledger import expires_at
from tessera.quota.objects import (
    FieldError,
    carries_policy,
    limits_of,
    policy_of,
    used_of,
)
from tessera.quota.status import over_hard
from tessera.reservations.forwarding import Forwarder
from tessera.reservations.store import QuotaStore

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


def pod_patch(pod: Mapping[str, Any], annotation: str | None) -> list[dict[str, Any]]:
    """Budget annotation + selection label (or removal of forged ones when ``None``); a
    release mark is the operator's alone and never survives a create."""
    meta = pod.get("metadata") or {}
    ops: list[dict[str, Any]] = []
    for section, key, value in (("annotations", ANNOTATION_BUDGET, annotation),
                                ("annotations", ANNOTATION_RELEASED, None),
                                ("labels", LABEL_BUDGETED,
                                 None if annotation is None else "true")):
        present = meta.get(section) or {}
        if value is None:
            if key in present:
                ops.append({"op": "remove", "path": f"/metadata/{section}/{_esc(key)}"})
        elif section not in meta or meta[section] is None:
            ops.append({"op": "add", "path": f"/metadata/{section}", "value": {key: value}})
        else:
            ops.append({"op": "add", "path": f"/metadata/{section}/{_esc(key)}",
                        "value": value})
    return ops


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
    store: QuotaStore
    forwarder: Forwarder | None = None
    """Hands reservations to the leader (see :mod:`tessera.reservations.forwarding`)."""
    create_deadline_s: float = 70.0
    """How long a reservation waits for its pod (:func:`tessera.quota.ledger.expires_at`)."""

    # -- pods ---------------------------------------------------------------------------
    #
    # Two webhooks: the mutating one fills in defaults and writes the budget (it runs before
    # the API server gives the pod its UID, so it reserves nothing); the validating one
    # checks the pod as it will be stored, and reserves its usage under its UID.

    async def mutate_pod(self, req: Mapping[str, Any]) -> Obj:
        return await self._timed("pods", self._mutate, req)

    async def validate_pod(self, req: Mapping[str, Any]) -> Obj:
        return await self._timed("pods-quota", self._validate, req)

    async def _timed(self, webhook: str, review: Any, req: Mapping[str, Any]) -> Obj:
        started = time.perf_counter()
        result = "error"
        try:
            resp: Obj = await review(req)
            result = "allowed" if resp["allowed"] else "denied"
            return resp
        finally:
            metrics.ADMISSION_SECONDS.labels(webhook, result).observe(
                time.perf_counter() - started)

    async def _budget(self, uid: str, pod: Mapping[str, Any], quotas: list[Obj]
                      ) -> Budget | Obj:
        """The pod's budget under the namespace's policy, or the refusal saying why not."""
        try:
            return budget_from_pod(pod.get("spec") or {}, policy_of(quotas))
        except (BudgetError, FieldError) as exc:
            return deny(uid, str(exc))

    async def _mutate(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        pod = req.get("object") or {}
        ns = _namespace(req)
        budget = await self._budget(uid, pod, await self.store.quotas(ns))
        if not isinstance(budget, Budget):
            return budget
        if not budget.requests_anything:
            return allow(uid, pod_patch(pod, None))
        filled = {c.name: c.filled for c in budget.containers if c.filled}
        return allow(uid, fill_patch(pod.get("spec") or {}, filled)
                     + pod_patch(pod, budget.annotation()))

    async def _validate(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        pod = req.get("object") or {}
        meta = pod.get("metadata") or {}
        ns, name = _namespace(req), str(meta.get("name") or "")
        dry = bool(req.get("dryRun"))
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        if req.get("operation", "CREATE") != "CREATE":
            return allow(uid)
        if ANNOTATION_RELEASED in annotations:
            return deny(uid, f"metadata.annotations[{ANNOTATION_RELEASED}] is written by the "
                             f"tessera operator when it gives a finished pod's budget back; "
                             f"a new pod cannot carry it: remove it")
        t0 = time.perf_counter()
        quotas = await self.store.quotas(ns)
        budget = await self._budget(uid, pod, quotas)
        if not isinstance(budget, Budget):
            return budget
        if not budget.requests_anything:
            if ANNOTATION_BUDGET in annotations or LABEL_BUDGETED in labels:
                return deny(uid, f"the pod carries {ANNOTATION_BUDGET} or {LABEL_BUDGETED} "
                                 f"but asks for no {PREFIX} resource: remove them")
            return allow(uid)
        written = _budget_written(annotations, labels)
        if written is None or written.containers != budget.to_api().containers:
            return deny(uid, f"the pod's {ANNOTATION_BUDGET} does not match its tessera "
                             f"resources (another mutating webhook changed the pod after "
                             f"tessera's): create it again, or have that webhook leave "
                             f"{PREFIX} resources, annotations and labels alone")
        usage = budget.usage()
        violations = check_fit(usage, [self.store.view(q) for q in quotas])
        if violations:
            return deny(uid, deny_message(violations))
        pod_uid = str(meta.get("uid") or "")
        if not pod_uid or not name:
            return deny(uid, "the pod has no UID or name yet: tessera's quota webhook must run "
                             "as validating admission")
        t1 = time.perf_counter()
        # The name check (a GET) and the reservation (a quota write, maybe at the leader)
        # run side by side: admission waits for the slower of the two, not for both.  A
        # taken name is rare; its reservation is then given back at once.
        taken_check = asyncio.ensure_future(self._name_taken(ns, name, pod_uid))
        refused: list[Violation] = []
        reserved = False
        try:
            if not dry:
                r = Reserve(pod_uid, name, usage,
                            expires_at(time.time(), self.create_deadline_s))
                refused = await self._reserve_anywhere(ns, quotas, r)
                reserved = not refused
            taken = await taken_check
        except BaseException:
            taken_check.cancel()
            if reserved:
                await self._give_back(ns, quotas, pod_uid)
            raise
        if taken is not None:
            if reserved:
                await self._give_back(ns, quotas, pod_uid)
            return deny(uid, taken, 409)
        if refused:
            return deny(uid, deny_message(refused))
        log.info("pod admitted", extra={"namespace": ns, "pod": name, "uid": pod_uid,
                                        "dryRun": dry, "memoryMiB": usage.memory_mib,
                                        "cores": usage.cores,
                                        "checkMs": round((t1 - t0) * 1000, 1),
                                        "reserveMs": round((time.perf_counter() - t1) * 1000,
                                                           1)})
        return allow(uid)

    async def _name_taken(self, ns: str, name: str, pod_uid: str) -> str | None:
        """Why the API server will refuse this create (another pod holds the name), if so.

        Storage refuses a taken name only after admission; a reservation for such a pod
        would wait for a pod that never comes.  So tessera refuses it first, as the API
        server would (409 AlreadyExists).
        """
        try:
            other = await self.kube.get(path("", "v1", "pods", ns, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        om = other.get("metadata") or {}
        if om.get("uid") == pod_uid:
            return None
        if om.get("deletionTimestamp"):
            return (f'pods "{name}" already exists (it is being deleted: create it again '
                    f"once it is gone)")
        return f'pods "{name}" already exists'

    async def _give_back(self, ns: str, quotas: list[Obj], pod_uid: str) -> None:
        """Release a reservation whose pod the API server will not store."""
        for q in quotas:
            await self.store.release(ns, str(q["metadata"]["name"]), Release(pod_uid, None))

    async def _reserve_anywhere(self, ns: str, quotas: list[Obj], r: Reserve
                                ) -> list[Violation]:
        """At the leader when there is one to hand to, else here."""
        if self.forwarder is not None:
            answer = await self.forwarder.reserve(ns, r)
            if answer is not None:
                return answer
        return await self.store.reserve(ns, quotas, r)

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
        raw_spec = obj.get("spec") or {}
        try:
            GPUQuotaSpec.model_validate(raw_spec)
        except ValidationError as exc:
            return deny(uid, _pydantic_message("spec", exc), 422)
        warnings: list[str] = []
        others = [q for q in (await self.kube.list(
            path(GROUP, VERSION, GPUQUOTAS, ns), cached=True)).get("items") or []
            if q["metadata"]["name"] != name]
        if carries_policy(raw_spec):
            holder = next((q for q in others if carries_policy(q.get("spec") or {})), None)
            if holder is not None:
                other = holder["metadata"]["name"]
                return deny(uid, f"spec: only one GPUQuota per namespace may set default, max, "
                                 f"weight or lending, and gpuquota/{other} does",
                            422)
        try:
            limits = limits_of(raw_spec)
        except FieldError as exc:
            return deny(uid, str(exc), 422)
        used = used_of(obj.get("status")) or Usage()
        for res, u, limit in over_hard(limits, used):
            warnings.append(f"spec.hard.{res} {limit} is below what admitted pods use now "
                            f"({u}): they keep running, new pods are refused")
        return allow(uid, warnings=warnings)


def _namespace(req: Mapping[str, Any]) -> str:
    pod = req.get("object") or {}
    return str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace", ""))


def _budget_written(annotations: Mapping[str, Any], labels: Mapping[str, Any]
                    ) -> PodBudget | None:
    """The budget tessera's mutating webhook wrote, if the pod still carries it whole."""
    if labels.get(LABEL_BUDGETED) != "true":
        return None
    try:
        return parse_budget(str(annotations.get(ANNOTATION_BUDGET)))
    except ValueError:
        return None


def _pydantic_message(prefix: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return f"{prefix}.{loc}: {first['msg']}" if loc else f"{prefix}: {first['msg']}"
