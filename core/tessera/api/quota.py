"""GPUQuota (namespaced): GPU memory and SM time a namespace's pods may use.

Cores are percent of one GPU's SMs (150 = one and a half GPUs) and memory a Kubernetes
quantity, both totals across a pod's GPUs, the same units pods ask in.  ``status.used`` is
counts only (never pod lists, which would grow without bound and churn Argo CD); it is
written by the operator from the pods it watches.  The race-free count at admission is a
ResourceQuota each GPUQuota manages (``tessera_operator.quota.managed``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, JsonValue, model_validator

from tessera.api.conditions import Condition
from tessera.api.crdtools import cel, list_map
from tessera.api.duration import PATTERN, parse_duration
from tessera.api.meta import ApiModel, FieldPathError, ObjectMeta
from tessera.api.profile import ProfileName
from tessera.api.quantity import Quantity

KIND = "GPUQuota"
PLURAL = "gpuquotas"

MAX_CORES = 100_000
"""1000 GPUs' worth of SMs; a bound so CEL's cost estimate stays small."""

Cores = Annotated[int, Field(ge=0, le=MAX_CORES)]
PodCores = Annotated[int, Field(ge=1, le=MAX_CORES)]


class PodBudgetLimits(ApiModel):
    """A per-pod budget: GPU memory and cores, totals over the pod's GPU shares."""

    memory: Quantity | None = None
    """GPU memory, e.g. 8Gi."""
    cores: PodCores | None = None
    """Percent of one GPU's SMs; 50 = half a GPU."""


class QuotaHard(ApiModel):
    """Namespace totals no admitted pod may push usage beyond."""

    memory: Quantity | None = None
    """GPU memory over all pods, e.g. 320Gi."""
    cores: Cores | None = None
    """Percent of one GPU's SMs over all pods (400 = four GPUs)."""
    pods: int | None = Field(default=None, ge=0, le=1_000_000)
    """Pods using tessera GPU resources."""
    mig_instances: dict[ProfileName, Annotated[int, Field(ge=0, le=100_000)]] | None = Field(
        default=None, max_length=32
    )
    """Whole MIG instances by profile name, e.g. {"1g.10gb": 8}."""


def _le_rule(small: str, big: str, quantity: bool) -> dict[str, Any]:
    a, b = f"self.{small}", f"self.{big}"
    guards = " && ".join(
        f"has(self.{part})" for path in (small, big) for part in _prefixes(path)
    )
    compare = (
        f"quantity(string({a})).compareTo(quantity(string({b}))) <= 0"
        if quantity
        else f"{a} <= {b}"
    )
    return cel(f"!({guards}) || {compare}", f"{small} must not exceed {big}", f".{small}")


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


# Cross-field rules that need no cluster state: default <= max <= hard.
_ORDER = (
    ("default.cores", "max.cores", False),
    ("max.cores", "hard.cores", False),
    ("default.cores", "hard.cores", False),
    ("default.memory", "max.memory", True),
    ("max.memory", "hard.memory", True),
    ("default.memory", "hard.memory", True),
)
_ORDER_RULES: list[JsonValue] = [_le_rule(small, big, q) for small, big, q in _ORDER]


AuditAction = Literal["Report", "Stop"]
"""What the node daemon's audit does about a finding: ``Report`` (a metric and an Event) or
``Stop`` (the same, and the process is killed with SIGKILL)."""


class QuotaEnforcement(ApiModel):
    """What the node daemons do when their audit (NVML's per-process figures, every period)
    finds a container of this namespace over its memory budget, or a GPU process of a pod of
    this namespace that tessera did not set up. Several quotas of one namespace: the strictest
    value of each field counts."""

    over_budget: AuditAction = "Report"
    """A container holding more device memory than its budget (on any of its GPUs)."""
    foreign_processes: AuditAction = "Report"
    """A process of a pod of this namespace using a GPU outside any container tessera's
    device plugin set up (a GPU obtained around the device plugin)."""


IdleAction = Literal["Report", "Evict"]
"""What the node daemons do about a pod that holds GPU memory while idle: ``Report`` (an Event
and a metric) or ``Evict`` (the same, and the pod is evicted through the Eviction API, so its
PodDisruptionBudgets are respected)."""

IDLE_MIN_AFTER_S = 10
"""The shortest ``idle.after`` admitted (the audit measures every 10 s by default); below
:data:`IDLE_WARN_AFTER_S` admission warns."""
IDLE_WARN_AFTER_S = 60
IDLE_MAX_AFTER_S = 30 * 24 * 3600


class QuotaIdle(ApiModel):
    """Reclaim of idle holders: a pod of this namespace that holds GPU memory while its
    containers' SM use stays under ``below`` for ``after`` (measured by the node daemon's
    audit: NVML per process on a GPU, the ledger's launch tokens inside a MIG instance)."""

    after: str = Field(pattern=PATTERN, min_length=2, max_length=24)
    """How long a pod must hold memory idle before the action, e.g. 30m or 1h30m (10s to
    720h; below 1m admission warns)."""
    action: IdleAction = "Report"
    """Report (an Event GPUIdle and a metric) or Evict (the same, then an eviction through
    the Eviction API: PodDisruptionBudgets are respected)."""
    below: int = Field(default=1, ge=1, le=100)
    """SM use, in percent of the GPU, under which a container counts as idle (on a whole
    GPU; inside a MIG instance any kernel launch counts as use)."""

    @model_validator(mode="after")
    def _after(self) -> Self:
        try:
            s = parse_duration(self.after)
        except ValueError as exc:
            raise FieldPathError("after", str(exc)) from None
        if not IDLE_MIN_AFTER_S <= s <= IDLE_MAX_AFTER_S:
            raise FieldPathError("after", f"after must be between {IDLE_MIN_AFTER_S}s and "
                                          f"{IDLE_MAX_AFTER_S // 3600}h")
        return self

    @property
    def after_s(self) -> int:
        return parse_duration(self.after)


class GPUQuotaSpec(ApiModel):
    """Totals for the namespace, and the per-pod budget defaults and ceiling.

    Only one GPUQuota per namespace may carry default, max, weight, lending and idle (checked at
    admission, since it depends on the other quotas); any number may carry hard.
    """

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _ORDER_RULES})

    hard: QuotaHard | None = None
    """Namespace totals."""
    default: PodBudgetLimits | None = None
    """Budget written into a pod that asks for tessera.dev/vgpu without memory or cores."""
    max: PodBudgetLimits | None = None
    """Largest budget one pod may ask for."""
    weight: int | None = Field(default=None, ge=1, le=1000)
    """Fair-share weight for idle GPU capacity (1 when absent)."""
    lending: bool | None = None
    """false: hard caps. This namespace's pods neither lend the core time they leave idle
    nor borrow what others leave idle; each holds exactly its core budget (true when
    absent)."""
    enforcement: QuotaEnforcement | None = None
    """What the node daemons' audit does about this namespace's containers over budget and
    its pods' GPU processes outside tessera (Report when absent)."""
    idle: QuotaIdle | None = None
    """Reclaim of pods that hold GPU memory without using the GPU (none when absent). A
    per-pod policy: only one GPUQuota per namespace may set it (with default, max, weight,
    lending)."""

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        for small, big, _ in _ORDER:
            a, b = self._lookup(small), self._lookup(big)
            if a is not None and b is not None and b < a:
                raise FieldPathError(small, f"{small} must not exceed {big}")
        return self

    def _lookup(self, path: str) -> Decimal | None:
        """The value at ``section.name`` (cores as a number, memory in bytes), if set."""
        section, name = path.split(".")
        holder = getattr(self, section)
        value = getattr(holder, name) if holder is not None else None
        if isinstance(value, Quantity):
            return value.value
        return None if value is None else Decimal(value)


class QuotaUsage(ApiModel):
    """Usage counted against ``hard``."""

    memory: Quantity = Field(default_factory=lambda: Quantity(0))
    """GPU memory held by running GPU pods."""
    cores: int = Field(default=0, ge=0)
    """Cores held by running GPU pods."""
    pods: int = Field(default=0, ge=0)
    """Running GPU pods."""
    mig_instances: dict[str, int] = Field(default_factory=dict)
    """Whole MIG instances by profile."""


class QuotaSummary(ApiModel):
    """used/hard strings for the printer columns (the operator writes them)."""

    cores: str | None = None
    """Cores used/hard, e.g. 150/400."""
    memory: str | None = None
    """GPU memory used/hard, e.g. 32Gi/320Gi."""
    pods: str | None = None
    """GPU pods used/hard."""


class GPUQuotaStatus(ApiModel):
    """Counts and conditions; written by the operator, never by users."""

    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation the operator last reconciled."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Ready, Progressing, Degraded."""
    used: QuotaUsage = Field(default_factory=QuotaUsage)
    """What the namespace's running GPU pods hold now (their live budgets), as the
    operator's pod watch counts them."""
    summary: QuotaSummary | None = None
    """used/hard texts for kubectl get."""


class GPUQuota(ApiModel):
    """GPU memory and SM limits for one namespace."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["GPUQuota"] = "GPUQuota"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUQuotaSpec
    status: GPUQuotaStatus | None = None
