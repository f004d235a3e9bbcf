"""The audit's decisions (pure): which container each GPU process belongs to, who is over
its memory budget, which processes are foreign, when a finding is confirmed and new, and
what the namespace's GPUQuotas say to do about it.

Inputs are plain data read by the runner: the containers tessera set up (with their budgets
per GPU or MIG UUID and their ledgers' live processes) and NVML's per-process records (host
PID, the UUID it holds memory on, ``usedGpuMemory``), each with its owner from
``/proc/<pid>/cgroup``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tessera_node.audit.cgroups import CgroupOwner

Action = Literal["Report", "Stop"]
ACTIONS: tuple[Action, ...] = ("Report", "Stop")


@dataclass(frozen=True, order=True)
class ContainerKey:
    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True)
class AuditedContainer:
    """A container tessera set up, as its budget file and ledger describe it now."""

    key: ContainerKey
    pod_uid: str
    container_id: str | None = None
    limits: Mapping[str, int | None] = field(default_factory=dict)
    """Device memory budget per GPU/MIG UUID in bytes; None: no limit (a whole MIG instance).
    A UUID not named has a budget of 0 (a pending or refused budget names none)."""
    ledger_ids: frozenset[tuple[int, int]] = frozenset()
    """(PID as the container sees it, start ticks) of its ledger's live processes."""


@dataclass(frozen=True)
class GPUProcess:
    """One NVML record: a host process holding memory on one GPU or MIG instance."""

    pid: int
    unit: str
    """``GPU-…`` (MIG disabled) or ``MIG-…`` UUID."""
    used_bytes: int | None
    """NVML's ``usedGpuMemory``; None where NVML does not say (counted as 0)."""
    name: str = ""
    """``pid 4242 (python3)``."""
    start_ticks: int | None = None
    """``/proc/<pid>/stat`` start time: the same in every PID namespace; None: unreadable."""
    inner_pid: int | None = None
    """The PID the process sees itself as (innermost ``NSpid``)."""
    owner: CgroupOwner | None = None
    """Its pod and container from ``/proc/<pid>/cgroup``; None: outside any pod."""
    unreadable: str | None = None
    """Why its owner could not be read (then it is never stopped)."""

    @property
    def identity(self) -> tuple[int, int, str]:
        return (self.pid, self.start_ticks or 0, self.unit)

    def label(self) -> str:
        return self.name or f"pid {self.pid}"


@dataclass(frozen=True)
class OverBudget:
    key: ContainerKey
    pod_uid: str
    unit: str
    used: int
    limit: int
    processes: tuple[GPUProcess, ...]


@dataclass(frozen=True)
class AuditResult:
    usage: Mapping[tuple[ContainerKey, str], int]
    """Bytes NVML shows per (container, UUID), for every UUID it was given or uses."""
    over: tuple[OverBudget, ...]
    foreign: tuple[GPUProcess, ...]
    held: Mapping[tuple[ContainerKey, str], tuple[GPUProcess, ...]] = field(
        default_factory=dict)
    """The processes attributed to each (container, UUID)."""


def attribute(p: GPUProcess, containers: Sequence[AuditedContainer]) -> AuditedContainer | None:
    """The tessera container a process belongs to, or None (foreign).

    Its pod comes from its cgroup only. Within the pod: the container whose runtime ID its
    cgroup names; where the registry knows no IDs, the one whose ledger lists the process
    (PID and start time), else the pod's only tessera container. A process in a pod tessera
    set up nothing in, in another container of the pod, or outside any pod is foreign."""
    if p.owner is None:
        return None
    cands = [c for c in containers if c.pod_uid == p.owner.pod_uid]
    if p.owner.container_id is not None:
        for c in cands:
            if c.container_id == p.owner.container_id:
                return c
        cands = [c for c in cands if c.container_id is None]
    if not cands:
        return None
    if p.inner_pid is not None and p.start_ticks is not None:
        listed = [c for c in cands if (p.inner_pid, p.start_ticks) in c.ledger_ids]
        if len(listed) == 1:
            return listed[0]
    return cands[0] if len(cands) == 1 else None


def limit_of(c: AuditedContainer, unit: str) -> int | None:
    return c.limits.get(unit, 0)


def audit(containers: Sequence[AuditedContainer], processes: Iterable[GPUProcess],
          slack_bytes: int = 0) -> AuditResult:
    """Every process attributed or foreign; a container is over budget on a UUID when what
    NVML shows its processes hold there exceeds its budget there by more than the slack."""
    usage: dict[tuple[ContainerKey, str], int] = {}
    held: dict[tuple[ContainerKey, str], list[GPUProcess]] = {}
    by_key = {c.key: c for c in containers}
    for c in containers:
        for unit in c.limits:
            usage[(c.key, unit)] = 0
    foreign: list[GPUProcess] = []
    for p in processes:
        owner = attribute(p, containers)
        if owner is None:
            foreign.append(p)
            continue
        k = (owner.key, p.unit)
        usage[k] = usage.get(k, 0) + (p.used_bytes or 0)
        held.setdefault(k, []).append(p)
    over = []
    for (key, unit), used in sorted(usage.items()):
        c = by_key[key]
        limit = limit_of(c, unit)
        if limit is not None and used > limit + slack_bytes:
            over.append(OverBudget(key, c.pod_uid, unit, used, limit,
                                   tuple(sorted(held.get((key, unit), ()),
                                                key=lambda p: p.pid))))
    return AuditResult(usage, tuple(over), tuple(sorted(foreign, key=lambda p: p.identity)),
                       {k: tuple(v) for k, v in held.items()})


# -- confirmation and deduplication ---------------------------------------------------------


@dataclass(frozen=True)
class Confirmed:
    over: tuple[tuple[OverBudget, bool], ...]
    """Confirmed over-budget findings, each with whether it is new (not reported before)."""
    foreign: tuple[tuple[GPUProcess, bool], ...]


class Tracker:
    """A finding counts once it was seen in ``confirm`` consecutive audits (a process that
    exits between NVML's list and /proc, a budget rewritten between two reads, is never
    reported); it is new the first time, and new again only after it was gone."""

    def __init__(self, confirm: int = 2) -> None:
        if confirm < 1:
            raise ValueError("confirm must be >= 1")
        self.confirm = confirm
        self._over: dict[tuple[ContainerKey, str], int] = {}
        self._foreign: dict[tuple[int, int, str], int] = {}

    def step(self, result: AuditResult) -> Confirmed:
        over_seen = {(f.key, f.unit): f for f in result.over}
        self._over = {k: self._over.get(k, 0) + 1 for k in over_seen}
        foreign_seen = {p.identity: p for p in result.foreign}
        self._foreign = {k: self._foreign.get(k, 0) + 1 for k in foreign_seen}
        return Confirmed(
            tuple((f, self._over[k] == self.confirm) for k, f in over_seen.items()
                  if self._over[k] >= self.confirm),
            tuple((p, self._foreign[k] == self.confirm) for k, p in foreign_seen.items()
                  if self._foreign[k] >= self.confirm))


# -- policy -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Enforcement:
    over_budget: Action = "Report"
    foreign_processes: Action = "Report"


def enforcement_of(quotas: Iterable[Mapping[str, Any]]) -> Enforcement:
    """A namespace's enforcement from its GPUQuotas' ``spec.enforcement``: the strictest value
    of each field (Stop beats Report); a value that is not one of them counts as Report."""
    over: Action = "Report"
    foreign: Action = "Report"
    for q in quotas:
        e = (q.get("spec") or {}).get("enforcement") or {}
        if not isinstance(e, Mapping):
            continue
        if e.get("overBudget") == "Stop":
            over = "Stop"
        if e.get("foreignProcesses") == "Stop":
            foreign = "Stop"
    return Enforcement(over, foreign)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def over_budget_message(f: OverBudget, stopped: Sequence[str] = (),
                        failed: Sequence[str] = ()) -> str:
    what = ", ".join(p.label() for p in f.processes) or "no process listed"
    text = (f"container {f.key.container} holds {_mib(f.used)} of GPU memory on {f.unit}, "
            f"over its budget of {_mib(f.limit)} (NVML per-process figures: {what})")
    return text + _outcome(stopped, failed, "overBudget")


def foreign_message(p: GPUProcess, pod: str | None, stopped: Sequence[str] = (),
                    failed: Sequence[str] = ()) -> str:
    where = (f"in pod {pod}" if pod else
             f"in pod UID {p.owner.pod_uid}" if p.owner else
             f"whose pod cannot be read ({p.unreadable})" if p.unreadable else "outside any pod")
    text = (f"{p.label()} {where} holds {_mib(p.used_bytes or 0)} of GPU memory on {p.unit} "
            f"and belongs to no container tessera set up")
    if p.owner is None and not stopped and not failed:
        return text + "; reported only (in no pod: no namespace's GPUQuota applies)"
    return text + _outcome(stopped, failed, "foreignProcesses")


def _outcome(stopped: Sequence[str], failed: Sequence[str], policy: str) -> str:
    """What was done: stopped, or why only reported."""
    out = ""
    if stopped:
        out += f"; stopped (SIGKILL): {', '.join(stopped)}"
    if failed:
        out += f"; could not stop: {', '.join(failed)}"
    if not stopped and not failed:
        out += f"; reported only (GPUQuota enforcement.{policy} is not Stop)"
    return out
