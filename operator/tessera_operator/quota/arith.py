"""Budgets, fit and counts -- the rules, without any I/O.

Units: GPU memory in whole MiB, cores in percent of one GPU's SMs (150 = one and a half
GPUs), pods and MIG instances as counts.  Every value a pod asks for is a *total* for its
container (``docs/operator.md``, "What a pod asks for"), so the scheduler, ResourceQuota and
GPUQuota all count the same number.

Where a container asks for several GPUs, the memory/cores are split evenly over them; a
core total above 100 % per share is refused because one share cannot exceed its GPU.

A pod's usage follows Kubernetes' effective-request rule (``resource.PodRequests``, KEP-753
sidecars), per resource: app containers and sidecar init containers (``restartPolicy:
Always``) run together and add up; a regular init container runs alone with the sidecars
declared before it; the pod holds the larger of the two, resource by resource
(:func:`effective_usage`, the one place the rule lives).  Admission classifies containers
from the spec it admits; recount reads the budget annotation and classifies its containers
by name from the pod's own spec (a name the spec does not declare counts as an app
container, so a malformed pod is overcounted, never undercounted).

A container that asks for shares must end up with a memory total (its own or the quota's
default): a budget without a memory limit would be no budget.  Missing cores without a
default mean 100 per share (the whole share, still shared fairly under contention).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from tessera.api import budget as api_budget
from tessera.api.claim_budget import ClaimBudget, ClaimBudgetError, parse_claim_budgets
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_CLAIM_BUDGET,
    GPU_POD,
    MIG_PREFIX,
    PREFIX,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.api.resources import mig_resource_name, profile_from_resource
from tessera_operator.quota.units import count, mib_quantity

RES_PODS = "pods"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
MAX_SHARES = api_budget.MAX_SHARES
NOT_COUNTED = ("is new and the operator has not counted this namespace's GPU pods yet; "
               "retry in a few seconds")


class PodRequestError(ValueError):
    """A pod's request is wrong on its own or against the per-pod max (message says why)."""


class FieldError(ValueError):
    """A GPUQuota field that cannot be read; the message names the field and the fix."""

    def __init__(self, quota: str | None, field: str, value: Any, reason: str) -> None:
        self.field = field
        self.short = f"{field}: {reason}"
        """The field and why, as the validating webhook refuses a GPUQuota with it."""
        where = f'GPUQuota "{quota}" ' if quota else ""
        super().__init__(f"{where}{field} {value!r} cannot be read ({reason}): fix the "
                         f"GPUQuota; until then it admits no GPU pods")


@dataclass(frozen=True)
class Usage:
    """What a pod uses, or what a quota has in use / allows."""

    memory_mib: int = 0
    cores: int = 0
    pods: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: Usage) -> Usage:
        mig = dict(self.mig)
        for k, v in other.mig.items():
            mig[k] = mig.get(k, 0) + v
        return Usage(self.memory_mib + other.memory_mib, self.cores + other.cores,
                     self.pods + other.pods, {k: v for k, v in mig.items() if v})

    def __sub__(self, other: Usage) -> Usage:
        """Release: never below zero (a drifted count is healed by recount, not by debt)."""
        mig = dict(self.mig)
        for k, v in other.mig.items():
            mig[k] = max(0, mig.get(k, 0) - v)
        return Usage(max(0, self.memory_mib - other.memory_mib), max(0, self.cores - other.cores),
                     max(0, self.pods - other.pods), {k: v for k, v in mig.items() if v})

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Usage):
            return NotImplemented
        return (self.memory_mib, self.cores, self.pods) == (
            other.memory_mib, other.cores, other.pods) and _nz(self.mig) == _nz(other.mig)

    def __hash__(self) -> int:
        return hash((self.memory_mib, self.cores, self.pods, tuple(sorted(_nz(self.mig).items()))))

    def peak(self, other: Usage) -> Usage:
        """Resource by resource, the larger of the two (each MIG profile on its own)."""
        mig = {k: max(self.mig.get(k, 0), other.mig.get(k, 0)) for k in {*self.mig, *other.mig}}
        return Usage(max(self.memory_mib, other.memory_mib), max(self.cores, other.cores),
                     max(self.pods, other.pods), _nz(mig))


def _nz(m: Mapping[str, int]) -> dict[str, int]:
    return {k: v for k, v in m.items() if v}


ContainerKind = Literal["app", "sidecar", "init"]
"""How a container runs: with the pod (``app``: ``spec.containers``), alongside it
(``sidecar``: an init container with ``restartPolicy: Always``), or alone before it
(``init``: a regular init container)."""


def effective_usage(containers: Iterable[tuple[ContainerKind, Usage]]) -> Usage:
    """A pod's quota usage from its budgeted containers, init containers in declaration order.

    Kubernetes' effective request, per resource: app containers and all sidecars together,
    or a regular init container with the sidecars declared before it, whichever is larger;
    plus one pod when any container is given.  Only the order of init containers relative
    to each other matters (app containers may come anywhere).
    """
    running = Usage()  # app containers + every sidecar: they hold their budgets together
    sidecars = Usage()  # sidecars declared so far: what a regular init container runs with
    init_peak = Usage()
    pods = 0
    for kind, usage in containers:
        pods = 1
        if kind == "init":
            init_peak = init_peak.peak(sidecars + usage)
            continue
        running = running + usage
        if kind == "sidecar":
            sidecars = sidecars + usage
    return running.peak(init_peak) + Usage(pods=pods)


@dataclass(frozen=True)
class Limits:
    """A GPUQuota's ``hard``: None (or an absent MIG profile) means not limited."""

    memory_mib: int | None = None
    cores: int | None = None
    pods: int | None = None
    mig: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class QuotaPolicy:
    """The per-pod ``default`` and ``max`` of the one GPUQuota in a namespace carrying them."""

    quota: str | None = None
    default_memory_mib: int | None = None
    default_cores: int | None = None
    max_memory_mib: int | None = None
    max_cores: int | None = None
    weight: int = 1
    lending: bool = True


@dataclass(frozen=True)
class QuotaView:
    """One GPUQuota as admission sees it: read at ``resource_version``."""

    name: str
    hard: Limits
    used: Usage
    resource_version: str = ""
    counted: bool = True
    """False until the operator first counted the namespace's pods (``status.used`` absent):
    such a quota admits nothing, as a ResourceQuota without status does not."""
    problem: str | None = None
    """Why this quota cannot be enforced (a field that cannot be read): it admits nothing."""
    policy: QuotaPolicy | None = None
    """The per-pod policy it carries (default, max, weight, lending), if any."""
    carries_policy: bool = False
    """Its spec names a policy field (read or not)."""
    error: FieldError | None = None
    """The error ``problem`` came from (raised where a policy is asked of this quota)."""

    @property
    def readable_limits(self) -> Limits | None:
        """``hard``, or None when the spec cannot be read (its managed ResourceQuota then
        admits nothing: :func:`tessera_operator.quota.managed.hard_of`)."""
        return None if self.problem is not None else self.hard


@dataclass(frozen=True)
class ContainerRequest:
    """One container's totals as admitted (the annotation stores them per share)."""

    name: str
    gpus: int = 0
    memory_mib: int = 0
    cores: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    filled: Mapping[str, int] = field(default_factory=dict)
    """Resources the webhook adds to this container's limits (name -> value)."""
    kind: ContainerKind = "app"
    """How it runs next to the pod's other containers (for the pod's quota usage)."""

    def usage(self) -> Usage:
        return Usage(self.memory_mib, self.cores, 0, _nz(self.mig))

    def to_api(self) -> api_budget.PerShareBudget:
        return api_budget.PerShareBudget.from_totals(self.gpus, self.memory_mib, self.cores,
                                                      dict(_nz(self.mig)))


@dataclass(frozen=True)
class PodRequest:
    """A pod's admitted budget: per container, and its total usage for quotas."""

    containers: tuple[ContainerRequest, ...]
    quota: str | None = None
    weight: int = 1
    lending: bool = True

    @property
    def requests_anything(self) -> bool:
        return any(c.gpus or c.mig for c in self.containers)

    def usage(self) -> Usage:
        """The pod's quota usage (:func:`effective_usage` over the budgeted containers)."""
        return effective_usage((c.kind, c.usage()) for c in self.containers if c.gpus or c.mig)

    def to_api(self) -> api_budget.BudgetAnnotation:
        return api_budget.BudgetAnnotation(
            quota=self.quota, weight=self.weight, lending=self.lending,
            containers={c.name: c.to_api() for c in self.containers if c.gpus or c.mig})

    def annotation(self) -> str:
        return self.to_api().to_annotation()


def container_usage(c: api_budget.PerShareBudget) -> Usage:
    """One container's totals back from its per-share budget (exact: MiB rounded back up)."""
    return Usage(-(-c.memory_bytes * c.shares // api_budget.MIB), round(c.cores * c.shares), 0,
                 _nz(c.mig))


def container_kinds(spec: Mapping[str, Any]) -> dict[str, ContainerKind]:
    """Init containers of a pod spec by name, in declaration order, as sidecar or init.

    App containers are not listed (absent means ``app``); a name declared both as an init
    and an app container (which Kubernetes refuses) is treated as an app container.
    """
    apps = {str(c.get("name", "")) for c in spec.get("containers") or []
            if isinstance(c, Mapping)}
    kinds: dict[str, ContainerKind] = {}
    for c in spec.get("initContainers") or []:
        if not isinstance(c, Mapping):
            continue
        name = str(c.get("name", ""))
        if name not in apps and name not in kinds:
            kinds[name] = "sidecar" if c.get("restartPolicy") == "Always" else "init"
    return kinds


def usage_of(budget: api_budget.BudgetAnnotation, spec: Mapping[str, Any] | None = None) -> Usage:
    """The pod's quota usage from its budget annotation and (for init containers) its spec.

    ``spec`` says which containers are init containers, sidecars, and in what order; without
    it (or for names it does not declare) every container counts as an app container.
    """
    kinds = container_kinds(spec or {})
    ordered = [n for n in kinds if n in budget.containers]
    ordered += [n for n in budget.containers if n not in kinds]
    return effective_usage((kinds.get(n, "app"), container_usage(budget.containers[n]))
                           for n in ordered)


def annotation_usage(raw: str, spec: Mapping[str, Any] | None = None) -> Usage:
    """Usage recorded in ``tessera.dev/budget`` (see :func:`usage_of`); ValueError if unreadable."""
    return usage_of(api_budget.parse_budget_annotation(raw), spec)


def _int_resource(container: str, res: str, value: Any) -> int:
    try:
        n = count(value)
    except (ValueError, TypeError):
        raise PodRequestError(f"container {container!r}: {res} must be a whole number, "
                          f"got {value!r}") from None
    if n < 0:
        raise PodRequestError(f"container {container!r}: {res} must not be negative")
    return n


def _container_budget(c: Mapping[str, Any], policy: QuotaPolicy,
                      kind: ContainerKind = "app") -> ContainerRequest:
    name = str(c.get("name", ""))
    res = c.get("resources") or {}
    asked: dict[str, Any] = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    values = {k: _int_resource(name, k, v) for k, v in asked.items() if k.startswith(PREFIX)}
    mig: dict[str, int] = {}
    for k, v in values.items():
        if k in (VGPU, VGPU_MEMORY, VGPU_CORES, GPU_POD):
            continue  # GPU_POD: the webhook's count of GPU pods, not a budget
        profile = profile_from_resource(k)
        if profile is None:
            raise PodRequestError(f"container {name!r}: unknown resource {k} (tessera offers "
                              f"{VGPU}, {VGPU_MEMORY}, {VGPU_CORES}, {MIG_PREFIX}<profile>)")
        if v:
            mig[profile] = v
    filled: dict[str, int] = {}
    gpus = values.get(VGPU)
    memory = values.get(VGPU_MEMORY)
    cores = values.get(VGPU_CORES)
    if memory == 0:
        raise PodRequestError(f"container {name!r}: {VGPU_MEMORY} is 0, and a GPU budget without "
                          f"memory is no budget: ask for the MiB it needs (at least 1), or "
                          f"leave {VGPU_MEMORY} out to get the GPUQuota's default")
    if gpus is not None and gpus > MAX_SHARES:
        raise PodRequestError(f"container {name!r}: {VGPU} {gpus} is more than {MAX_SHARES} GPU "
                          f"shares; ask for at most {MAX_SHARES}")
    if gpus is None and (memory or cores):
        gpus = filled[VGPU] = 1
    gpus = gpus or 0
    if gpus == 0:
        if memory or cores:
            raise PodRequestError(f"container {name!r}: {VGPU} is 0 but it asks for GPU "
                              f"memory or cores")
        return ContainerRequest(name=name, mig=mig, kind=kind)
    if memory is None:
        if policy.default_memory_mib is None:
            where = f'GPUQuota "{policy.quota}"' if policy.quota else "no GPUQuota"
            raise PodRequestError(f"container {name!r} asks for {VGPU} without {VGPU_MEMORY} "
                              f"and {where} sets no default memory: add {VGPU_MEMORY} (MiB, "
                              f"total) to its limits")
        memory = filled[VGPU_MEMORY] = policy.default_memory_mib * gpus
        if memory == 0:
            raise PodRequestError(f"container {name!r} asks for {VGPU} without {VGPU_MEMORY} and "
                              f"GPUQuota \"{policy.quota}\" default.memory is 0: add "
                              f"{VGPU_MEMORY} (MiB, total) to its limits")
    if cores is None:
        per_share = 100 if policy.default_cores is None else min(policy.default_cores, 100)
        cores = filled[VGPU_CORES] = per_share * gpus
    if cores > 100 * gpus:
        raise PodRequestError(f"container {name!r}: {VGPU_CORES} {cores} over {gpus} GPU "
                          f"share(s) is more than 100 per share")
    return ContainerRequest(name=name, gpus=gpus, memory_mib=memory, cores=cores, mig=mig,
                           filled=filled, kind=kind)


def budget_from_pod(spec: Mapping[str, Any], policy: QuotaPolicy = QuotaPolicy()) -> PodRequest:
    """Each container's budget, filling missing memory/cores from the quota defaults.

    Raises PodRequestError for requests that are wrong on their own or exceed the per-pod max.
    """
    kinds = container_kinds(spec)
    inits = [_container_budget(c, policy, kinds.get(str(c.get("name", "")), "app"))
             for c in spec.get("initContainers") or []]
    apps = [_container_budget(c, policy) for c in spec.get("containers") or []]
    budget = PodRequest((*inits, *apps), policy.quota, policy.weight, policy.lending)
    total = budget.usage()  # the effective usage: what the pod holds at its peak
    where = f'GPUQuota "{policy.quota}" max' if policy.quota else "max"
    if policy.max_memory_mib is not None and total.memory_mib > policy.max_memory_mib:
        raise PodRequestError(f"pod asks for {VGPU_MEMORY} {mib_quantity(total.memory_mib)} in "
                          f"total, over the per-pod {where} {mib_quantity(policy.max_memory_mib)}")
    if policy.max_cores is not None and total.cores > policy.max_cores:
        raise PodRequestError(f"pod asks for {VGPU_CORES} {total.cores} in total, over the per-pod "
                          f"{where} {policy.max_cores}")
    try:
        budget.to_api()
    except ValidationError as exc:  # a bound of the annotation's format the rules above missed
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PodRequestError(f"the budget cannot be written ({loc}: {first['msg']}): lower "
                          f"the pod's {PREFIX} limits") from None
    return budget


@dataclass(frozen=True)
class Violation:
    """One resource of one quota that a request does not fit."""

    quota: str
    resource: str
    requested: str
    used: str
    hard: str
    reason: str = "exceeded"

    def __str__(self) -> str:
        if self.reason != "exceeded":
            return f'GPUQuota "{self.quota}": {self.reason}'
        return (f'exceeded GPUQuota "{self.quota}": {self.resource} requested {self.requested}, '
                f"used {self.used}, hard {self.hard}")


def check_fit(request: Usage, quotas: Iterable[QuotaView]) -> list[Violation]:
    """Every way ``request`` does not fit the quotas' hard limits (empty list = fits)."""
    out: list[Violation] = []
    for q in sorted(quotas, key=lambda q: q.name):
        if q.problem is not None:
            out.append(Violation(q.name, "", "", "", "", reason=q.problem))
            continue
        if not q.counted:
            out.append(Violation(q.name, "", "", "", "", reason=NOT_COUNTED))
            continue
        h, u = q.hard, q.used
        checks: list[tuple[str, int | None, int, int, bool]] = [
            (VGPU_MEMORY, h.memory_mib, request.memory_mib, u.memory_mib, True),
            (VGPU_CORES, h.cores, request.cores, u.cores, False),
            (RES_PODS, h.pods, request.pods, u.pods, False),
        ]
        for profile, mig_limit in sorted(h.mig.items()):
            checks.append((mig_resource_name(profile), mig_limit, request.mig.get(profile, 0),
                           u.mig.get(profile, 0), False))
        for res, limit, req, used, is_mem in checks:
            if limit is None or req == 0 or used + req <= limit:
                continue
            fmt = mib_quantity if is_mem else str
            out.append(Violation(q.name, res, fmt(req), fmt(used), fmt(limit)))
    return out


def deny_message(violations: Iterable[Violation]) -> str:
    return "; ".join(str(v) for v in violations)


def pod_counts(pod: Mapping[str, Any]) -> bool:
    """Whether a pod holds its budget: admitted with one and not finished (as Kubernetes'
    ResourceQuota counts: a pod in phase Succeeded or Failed holds nothing)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if ANNOTATION_BUDGET not in annotations and ANNOTATION_CLAIM_BUDGET not in annotations:
        return False
    return (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES


def pod_usage(pod: Mapping[str, Any]) -> Usage:
    """The usage recorded on an admitted pod (zero when the annotation is unreadable).

    Its containers are classified by name from the pod's own spec, as admission did.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_BUDGET)
    if raw is None:  # a pod of DRA claims: its claims' growth (their holders hold the rest)
        try:
            return claims_growth(parse_claim_budgets(annotations.get(ANNOTATION_CLAIM_BUDGET)))
        except ClaimBudgetError:
            return Usage()
    try:
        return annotation_usage(raw, pod.get("spec") or {})
    except (ValueError, TypeError, KeyError):
        return Usage()


def claims_growth(budgets: Mapping[str, ClaimBudget]) -> Usage:
    """What DRA claims' live budgets hold beyond their allocations (``tessera.dev/
    claim-budget``; the claims' holders hold the allocations): what the pod's growth holders
    hold, and what its GPUQuotas count for it."""
    return Usage(sum(b.growth[0] for b in budgets.values()),
                 sum(b.growth[1] for b in budgets.values()))


def total(usages: Iterable[Usage]) -> Usage:
    """The sum of what several pods (or holders) hold."""
    out = Usage()
    for u in usages:
        out = out + u
    return out


def recount(pods: Iterable[Mapping[str, Any]]) -> Usage:
    """What a namespace's pods hold: the truth ``status.used`` is healed towards."""
    total = Usage()
    for p in pods:
        if pod_counts(p):
            total = total + pod_usage(p)
    return total


def resource_usage(pod: Mapping[str, Any]) -> Usage:
    """What a pod's own resources ask for, as Kubernetes' ResourceQuota counts them (a live
    resize can take the budget beyond this); zero when they cannot be read."""
    try:
        return budget_from_pod(pod.get("spec") or {}).usage()
    except (PodRequestError, ValueError, TypeError):
        return Usage()
