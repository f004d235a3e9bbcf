"""What the webhooks decide: budgets + quota reservation for pods, checks for the CRs.

Reservation follows Kubernetes' ResourceQuota admission: read the quota, check the request
against ``hard``, write the new ``used`` with the read ``resourceVersion`` as precondition,
and on a conflict (another replica or request won) read again and re-check.  So concurrent
creates through any number of replicas can never push ``used`` past ``hard``.  A pod must
fit every GPUQuota of its namespace; if a later quota refuses, the earlier reservations are
given back.  A server-side dry run checks everything and reserves nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from tessera.api.inventory import LABEL_PRODUCT, from_node
from tessera.api.partition import GPUPartitionSpec
from tessera.api.quota import GPUQuotaSpec
from tessera.controller import metrics
from tessera.controller.kube import ApiError, Kube, Obj, path
from tessera.partition import PartitionView, resolve, spec_errors
from tessera.quota.arith import (
    ANNOTATION_BUDGET,
    LABEL_BUDGETED,
    BudgetError,
    Usage,
    Violation,
    budget_from_pod,
    check_fit,
    deny_message,
)
from tessera.quota.objects import (
    carries_policy,
    limits_of,
    policy_of,
    used_of,
    used_patch,
    view_of,
)
from tessera.quota.units import mib_quantity
from tessera.webhooks.forwarding import Forwarder

log = logging.getLogger("tessera.admission")

MAX_ATTEMPTS = 50
"""Conflict retries per quota; each loser re-reads, so this bounds contention, not work."""


def _esc(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def allow(uid: str, patch: list[dict[str, Any]] | None = None,
          warnings: list[str] | None = None) -> Obj:
    out: Obj = {"uid": uid, "allowed": True}
    if patch:
        import base64
        import json
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        out["warnings"] = warnings
    return out


def deny(uid: str, message: str, code: int = 403) -> Obj:
    reason = {403: "Forbidden", 422: "Invalid"}.get(code, "BadRequest")
    return {"uid": uid, "allowed": False,
            "status": {"code": code, "reason": reason, "message": message}}


def pod_patch(pod: Mapping[str, Any], annotation: str | None) -> list[dict[str, Any]]:
    """Budget annotation + selection label (or removal of forged ones when ``None``)."""
    meta = pod.get("metadata") or {}
    ops: list[dict[str, Any]] = []
    for section, key, value in (("annotations", ANNOTATION_BUDGET, annotation),
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
                        k.startswith("tessera.dev/") for k in (have or {})):
                    continue
                if not have:
                    ops.append({"op": "add", "path": f"{base}/{section}", "value": values})
                else:
                    ops.extend({"op": "add", "path": f"{base}/{section}/{_esc(k)}", "value": v}
                               for k, v in values.items())
    return ops


@dataclass
class _Pending:
    usage: Usage
    add: bool
    fut: asyncio.Future[list[Violation] | None]


@dataclass
class Admission:
    """Pod and CR admission.

    Within one replica, reservations on the same quota are group-committed: requests that
    arrive while a write is in flight are checked one after another (first come, first
    served) against the newest copy this replica knows and written as one update.  Only
    writes by other replicas (or releases/recount) cost a conflict and a re-read.  The
    resourceVersion precondition, not the batching, is what makes reservations correct.
    """

    kube: Kube
    forwarder: Forwarder | None = None
    """Hands reservations to the leader (see :mod:`tessera.webhooks.forwarding`)."""
    conflict_wait_s: float = 0.02
    """After a lost write, how long to wait for the quota watch to bring the winner's
    version before paying a GET for it."""
    _latest: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _cache: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _synced: bool = False
    _changed: asyncio.Event | None = None
    _listener: Callable[[str, Obj], None] | None = None
    _queues: dict[tuple[str, str], list[_Pending]] = field(default_factory=dict)
    _workers: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)

    # -- pods ---------------------------------------------------------------------------

    async def review_pod(self, req: Mapping[str, Any]) -> Obj:
        uid = str(req.get("uid", ""))
        pod = req.get("object") or {}
        ns = str(req.get("namespace") or (pod.get("metadata") or {}).get("namespace", ""))
        dry = bool(req.get("dryRun"))
        started = time.perf_counter()
        result = "error"
        try:
            resp = await self._pod(uid, ns, pod, dry)
            result = "allowed" if resp["allowed"] else "denied"
            return resp
        finally:
            metrics.ADMISSION_SECONDS.labels("pods", result).observe(
                time.perf_counter() - started)

    async def _pod(self, uid: str, ns: str, pod: Mapping[str, Any], dry: bool) -> Obj:
        t0 = time.perf_counter()
        # From this replica's quota watch (or, until it has synced, the API server's watch
        # cache): a stale copy costs one conflict and a re-read in reserve() (every write
        # is conditional), never a wrong count.
        quotas = await self._quotas(ns)
        t_list = time.perf_counter() - t0
        try:
            budget = budget_from_pod(pod.get("spec") or {}, policy_of(quotas))
        except BudgetError as exc:
            return deny(uid, str(exc))
        if not budget.requests_anything:
            return allow(uid, pod_patch(pod, None))
        usage = budget.usage()
        violations = check_fit(usage, [view_of(q) for q in quotas])
        if violations:
            return deny(uid, deny_message(violations))
        t1 = time.perf_counter()
        if not dry:
            refused = await self._reserve_anywhere(ns, quotas, usage)
            if refused:
                return deny(uid, deny_message(refused))
        t_reserve = time.perf_counter() - t1
        filled = {c.name: c.filled for c in budget.containers if c.filled}
        ops = fill_patch(pod.get("spec") or {}, filled) + pod_patch(pod, budget.annotation())
        log.info("pod admitted", extra={"namespace": ns, "dryRun": dry,
                                        "memoryMiB": usage.memory_mib, "cores": usage.cores,
                                        "listMs": round(t_list * 1000, 1),
                                        "reserveMs": round(t_reserve * 1000, 1)})
        return allow(uid, ops)

    async def _quotas(self, ns: str) -> list[Obj]:
        if not self._synced:
            return (await self.kube.list(path("tessera.dev", "v1alpha1", "gpuquotas", ns),
                                         cached=True)).get("items") or []
        out = []
        for key, q in self._cache.items():
            if key[0] == ns:
                known = self._latest.get(key)
                out.append(known if known is not None and _rv(known) > _rv(q) else q)
        return out

    def subscribe(self, listener: Callable[[str, Obj], None] | None) -> None:
        """Pass this replica's quota watch events on (the leader's controller listens).

        One watch serves admission and reconciliation: a second one through kopf cost the
        leader's event loop enough per reservation to show in admission's p99.  A new
        listener first gets a SYNC with every quota known now.
        """
        self._listener = listener
        if listener is not None and self._synced:
            listener("SYNC", {"items": list(self._cache.values())})

    async def watch_quotas(self) -> None:
        """Every replica keeps the GPUQuotas in memory: admission reads them without a LIST
        per pod, and a reservation that lost a race learns the winner's version from the
        watch instead of a GET.  Only a cache: every write still carries the
        resourceVersion it was computed from."""
        try:
            async for typ, obj in self.kube.watch(path("tessera.dev", "v1alpha1",
                                                       "gpuquotas")):
                if typ == "SYNC":
                    self._cache = {_key(q): q for q in obj.get("items") or []}
                    self._synced = True
                    for key, q in self._cache.items():
                        known = self._latest.get(key)
                        if known is not None and _rv(q) > _rv(known):
                            self._latest[key] = q
                elif typ == "DELETED":
                    self._cache.pop(_key(obj), None)
                else:
                    key = _key(obj)
                    self._cache[key] = obj
                    known = self._latest.get(key)
                    if known is not None and _rv(obj) > _rv(known):
                        self._latest[key] = obj
                if self._changed is not None:
                    self._changed.set()
                    self._changed = None
                if self._listener is not None:
                    try:
                        self._listener(typ, obj)
                    except Exception:  # the admission cache must outlive a listener bug
                        log.exception("quota listener failed", extra={"event": typ})
        finally:
            self._synced = False

    async def _newer(self, key: tuple[str, str], than: int) -> Obj | None:
        """The quota at a resourceVersion above ``than``, from the watch if it comes soon."""
        if not self._synced:
            return None
        deadline = asyncio.get_running_loop().time() + self.conflict_wait_s
        while True:
            got = self._cache.get(key)
            if got is not None and _rv(got) > than:
                return got
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return None

    async def _reserve_anywhere(self, ns: str, quotas: list[Obj], usage: Usage
                                ) -> list[Violation]:
        """At the leader when there is one to hand to, else here."""
        if self.forwarder is not None:
            answer = await self.forwarder.reserve(ns, usage)
            if answer is not None:
                return answer
        return await self.reserve(ns, quotas, usage)

    async def reserve_forwarded(self, ns: str, usage: Usage) -> list[Violation]:
        """A reservation another replica handed over: against this replica's quota copies."""
        return await self.reserve(ns, await self._quotas(ns), usage)

    async def reserve(self, ns: str, quotas: list[Obj], usage: Usage) -> list[Violation]:
        """Add ``usage`` to every quota (CAS); on refusal give back what was taken."""
        done: list[str] = []
        for q in sorted(quotas, key=lambda q: str(q["metadata"]["name"])):
            refused = await self._cas(ns, q, usage, add=True)
            if refused is None:  # quota vanished meanwhile: nothing to count against
                continue
            if refused:
                for name in done:
                    await self.release(ns, name, usage)
                return refused
            done.append(str(q["metadata"]["name"]))
        return []

    async def release(self, ns: str, name: str, usage: Usage) -> None:
        try:
            q = await self.kube.get(path("tessera.dev", "v1alpha1", "gpuquotas", ns, name))
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        await self._cas(ns, q, usage, add=False)

    async def _cas(self, ns: str, q: Obj, usage: Usage, add: bool) -> list[Violation] | None:
        """Queue one reservation (or release) on quota ``q``; [] = done, None = no quota."""
        key = (ns, str(q["metadata"]["name"]))
        known = self._latest.get(key)
        if known is None or _rv(q) > _rv(known):
            self._latest[key] = q
        fut: asyncio.Future[list[Violation] | None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, []).append(_Pending(usage, add, fut))
        worker = self._workers.get(key)
        if worker is None or worker.done():
            self._workers[key] = asyncio.create_task(self._drain(key))
        return await fut

    async def _drain(self, key: tuple[str, str]) -> None:
        """Group commit: everything queued while a write was in flight goes in one write."""
        while self._queues.get(key):
            batch = self._queues.pop(key)
            metrics.RESERVATION_BATCH.observe(len(batch))
            try:
                results = await self._write_batch(key, batch)
            except Exception as exc:
                for p in batch:
                    if not p.fut.done():
                        p.fut.set_exception(exc)
                continue
            for p, r in zip(batch, results, strict=True):
                if not p.fut.done():
                    p.fut.set_result(r)

    async def _write_batch(self, key: tuple[str, str], batch: list[_Pending]
                           ) -> list[list[Violation] | None]:
        ns, name = key
        url = path("tessera.dev", "v1alpha1", "gpuquotas", ns, name)
        q = self._latest[key]
        for _ in range(MAX_ATTEMPTS):
            view = view_of(q)
            used = used_of(q.get("status")) or Usage()
            cur = used
            results: list[list[Violation] | None] = []
            for p in batch:  # first come, first served
                if p.add:
                    refused = check_fit(p.usage, [replace(view, used=cur)])
                    if refused:
                        results.append(refused)
                        continue
                    cur = cur + p.usage
                else:
                    cur = cur - p.usage
                results.append([])
            if cur == used and q.get("status", {}).get("used") is not None:
                return results
            sent = time.perf_counter()
            try:
                self._latest[key] = await self.kube.merge_patch(url + "/status",
                                                                used_patch(q, cur))
                return results
            except ApiError as exc:
                if exc.status == 404:
                    self._latest.pop(key, None)
                    return [None] * len(batch)
                if exc.status != 409:
                    raise
                metrics.RESERVATION_CONFLICTS.inc()
            finally:
                metrics.QUOTA_WRITE_SECONDS.observe(time.perf_counter() - sent)
            # another replica won: let what queued meanwhile ride along on the retry
            # (fewer writes, so fewer conflicts), after a little jitter so two replicas
            # do not keep colliding in lockstep
            batch.extend(self._queues.pop(key, []))
            await asyncio.sleep(random.uniform(0, 0.004))
            newer = await self._newer(key, _rv(q))
            if newer is not None:
                q = self._latest[key] = newer
                continue
            try:
                q = self._latest[key] = await self.kube.get(url)
            except ApiError as exc:
                if exc.status == 404:
                    self._latest.pop(key, None)
                    return [None] * len(batch)
                raise
        busy = Violation(name, "", "", "", "", reason=(
            f"too many concurrent updates ({MAX_ATTEMPTS} conflicts); try again"))
        return [[busy] for _ in batch]

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
        nodes = (await self.kube.list(path("", "v1", "nodes"), LABEL_PRODUCT, cached=True)
                 ).get("items") or []
        parts = (await self.kube.list(path("tessera.dev", "v1alpha1", "gpupartitions"),
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
            path("tessera.dev", "v1alpha1", "gpuquotas", ns), cached=True)).get("items") or []
            if q["metadata"]["name"] != name]
        if carries_policy(raw_spec):
            holder = next((q for q in others if carries_policy(q.get("spec") or {})), None)
            if holder is not None:
                return deny(uid, f"spec: only one GPUQuota per namespace may set default, max "
                                 f"or weight, and gpuquota/{holder['metadata']['name']} does",
                            422)
        used = used_of(obj.get("status")) or Usage()
        hard = limits_of(raw_spec)
        for res, limit, u, fmt in (("memory", hard.memory_mib, used.memory_mib, mib_quantity),
                                   ("cores", hard.cores, used.cores, str),
                                   ("pods", hard.pods, used.pods, str)):
            if limit is not None and u > limit:
                warnings.append(f"spec.hard.{res} {fmt(limit)} is below what admitted pods use "
                                f"now ({fmt(u)}): they keep running, new pods are refused")
        return allow(uid, warnings=warnings)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _rv(obj: Mapping[str, Any]) -> int:
    """resourceVersion as a number, only to pick the newer of two copies of one object
    (a wrong pick costs a conflict and a re-read, never a wrong count)."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _pydantic_message(prefix: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    return f"{prefix}.{loc}: {first['msg']}" if loc else f"{prefix}: {first['msg']}"
