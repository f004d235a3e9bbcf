"""The audit's decisions (pure): which container each GPU process belongs to, who is over
its memory budget, which processes are foreign, which containers did something to the files
tessera gave them, when a finding is confirmed and new, and what the namespace's GPUQuotas
say to do about it.

Inputs are plain data read by the runner: the containers tessera set up (with their budgets
per GPU or MIG UUID, their ledgers' live processes and what those account for, what became
of their ledgers, and the identities of the files the daemon made), and NVML's per-process
records (host PID, the UUID it holds memory on, ``usedGpuMemory``), each with its owner from
``/proc/<pid>/cgroup`` and the files it sees at ``/run/tessera``.

**Tampering** is what only the node can know and libtessera cannot: a container's ledger
gone, replaced, truncated or not a ledger any more; a GPU process of the container that sees
another budget file or ledger than the daemon's (a mount namespace of its own, a chroot);
memory over the budget that the ledger does not account for (a process around the library,
or counts the container zeroed). It is treated like over budget **at once**: a finding at
the first audit that sees it, not after two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tessera_node.device.cgroups import CgroupOwner

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
    files: Files | None = None
    """The files the daemon made for it (None: not known, nothing checked)."""
    tampered: str | None = None
    """Why its ledger is not the one the daemon made (gone, replaced, truncated, garbage)."""
    accounted: Mapping[str, int] | None = None
    """Per UUID, the bytes its ledger's live processes say they hold (None: no ledger read)."""
    other_pod_uids: frozenset[str] = frozenset()
    """Other pods whose processes are its own (a DRA claim's budget is shared by every pod
    that uses the claim)."""

    def of_pod(self, pod_uid: str) -> bool:
        return pod_uid == self.pod_uid or pod_uid in self.other_pod_uids


@dataclass(frozen=True)
class Files:
    """(device, inode) of a container's budget file and of the ledger it names (None: the
    budget names none, as an older daemon's; then any ledger the process sees is its own)."""

    budget: tuple[int, int]
    ledger: tuple[int, int] | None = None


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
    sees: Sees | None = None
    """The files it sees at /run/tessera (None: not looked at, or it went meanwhile)."""

    @property
    def identity(self) -> tuple[int, int, str]:
        return (self.pid, self.start_ticks or 0, self.unit)

    def label(self) -> str:
        return self.name or f"pid {self.pid}"


@dataclass(frozen=True)
class Sees:
    """(device, inode) of what a process finds at /run/tessera/budget and /run/tessera/ledger
    in its own root and mount namespace; None: nothing there."""

    budget: tuple[int, int] | None
    ledger: tuple[int, int] | None


@dataclass(frozen=True)
class OverBudget:
    key: ContainerKey
    pod_uid: str
    unit: str
    used: int
    limit: int
    processes: tuple[GPUProcess, ...]
    evidence: str | None = None
    """Why this is not an accident of timing (then it counts at once): the container
    tampered, or its ledger does not account for what NVML shows."""


@dataclass(frozen=True)
class Tampered:
    """A container did something to the files tessera gave it (treated like over budget)."""

    key: ContainerKey
    pod_uid: str
    why: str
    processes: tuple[GPUProcess, ...]
    """Its GPU processes, on every UUID."""


@dataclass(frozen=True)
class AuditResult:
    usage: Mapping[tuple[ContainerKey, str], int]
    """Bytes NVML shows per (container, UUID), for every UUID it was given or uses."""
    over: tuple[OverBudget, ...]
    foreign: tuple[GPUProcess, ...]
    held: Mapping[tuple[ContainerKey, str], tuple[GPUProcess, ...]] = field(
        default_factory=dict)
    """The processes attributed to each (container, UUID)."""
    tampered: tuple[Tampered, ...] = ()


def attribute(p: GPUProcess, containers: Sequence[AuditedContainer]) -> AuditedContainer | None:
    """The tessera container a process belongs to, or None (foreign).

    Its pod comes from its cgroup only (a DRA claim is any of the pods that use it). Within
    the pod: the container whose runtime ID its
    cgroup names; where the registry knows no IDs, the one whose ledger lists the process
    (PID and start time), else the pod's only tessera container. A process in a pod tessera
    set up nothing in, in another container of the pod, or outside any pod is foreign."""
    if p.owner is None:
        return None
    cands = [c for c in containers if c.of_pod(p.owner.pod_uid)]
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
    tampered = {}
    for c in containers:
        mine = sorted((p for (k, _u), ps in held.items() if k == c.key for p in ps),
                      key=lambda p: (p.pid, p.unit))
        why = tampering(c, mine)
        if why is not None:
            tampered[c.key] = Tampered(c.key, c.pod_uid, why, tuple(mine))
    over = []
    for (key, unit), used in sorted(usage.items()):
        c = by_key[key]
        limit = limit_of(c, unit)
        if limit is not None and used > limit + slack_bytes:
            t = tampered.get(key)
            evidence = t.why if t else None
            if evidence is None and c.accounted is not None:
                counted = c.accounted.get(unit, 0)
                if counted <= limit:
                    evidence = (f"its ledger accounts for {_mib(counted)} of them: memory "
                                f"the library did not count")
            over.append(OverBudget(key, c.pod_uid, unit, used, limit,
                                   tuple(sorted(held.get((key, unit), ()),
                                                key=lambda p: p.pid)), evidence))
    return AuditResult(usage, tuple(over), tuple(sorted(foreign, key=lambda p: p.identity)),
                       {k: tuple(v) for k, v in held.items()},
                       tuple(tampered[k] for k in sorted(tampered)))


def tampering(c: AuditedContainer, processes: Sequence[GPUProcess]) -> str | None:
    """Why a container's files are not what the daemon made, or None: its ledger (as the
    runner found it), and the files each of its GPU processes sees at /run/tessera."""
    if c.tampered is not None:
        return c.tampered
    if c.files is None or c.files.ledger is None:
        return None  # not known, or a container an older daemon set up: not checked
    for p in processes:
        if p.sees is None:
            continue
        if p.sees.budget != c.files.budget:
            what = "no budget file" if p.sees.budget is None else "another budget file"
            return f"{p.label()} sees {what} at /run/tessera/budget"
        if p.sees.ledger != c.files.ledger:
            what = "no ledger" if p.sees.ledger is None else "another ledger"
            return f"{p.label()} sees {what} at /run/tessera/ledger"
    return None


# -- confirmation and deduplication ---------------------------------------------------------


@dataclass(frozen=True)
class Confirmed:
    over: tuple[tuple[OverBudget, bool], ...]
    """Confirmed over-budget findings, each with whether it is new (not reported before)."""
    foreign: tuple[tuple[GPUProcess, bool], ...]
    tampered: tuple[tuple[Tampered, bool], ...] = ()


class Tracker:
    """A finding counts once it was seen in ``confirm`` consecutive audits (a process that
    exits between NVML's list and /proc, a budget rewritten between two reads, is never
    reported); it is new the first time, and new again only after it was gone. Tampering,
    and an over-budget finding with evidence of it, count at the first audit that sees them:
    no timing makes a ledger vanish or a process see another file."""

    def __init__(self, confirm: int = 2) -> None:
        if confirm < 1:
            raise ValueError("confirm must be >= 1")
        self.confirm = confirm
        self._over: dict[tuple[ContainerKey, str], int] = {}
        self._foreign: dict[tuple[int, int, str], int] = {}
        self._tampered: dict[ContainerKey, int] = {}

    def step(self, result: AuditResult) -> Confirmed:
        over_seen = {(f.key, f.unit): f for f in result.over}
        was = self._over
        self._over = {k: max(was.get(k, 0) + 1, self.confirm if f.evidence else 0)
                      for k, f in over_seen.items()}
        foreign_seen = {p.identity: p for p in result.foreign}
        self._foreign = {k: self._foreign.get(k, 0) + 1 for k in foreign_seen}
        tampered_seen = {t.key: t for t in result.tampered}
        was_t = self._tampered
        self._tampered = {k: was_t.get(k, 0) + 1 for k in tampered_seen}
        return Confirmed(
            tuple((f, was.get(k, 0) < self.confirm <= self._over[k])
                  for k, f in over_seen.items() if self._over[k] >= self.confirm),
            tuple((p, self._foreign[k] == self.confirm) for k, p in foreign_seen.items()
                  if self._foreign[k] >= self.confirm),
            tuple((t, self._tampered[k] == 1) for k, t in tampered_seen.items()))


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
    if f.evidence:
        text += f"; {f.evidence}"
    return text + _outcome(stopped, failed, "overBudget")


def tampered_message(t: Tampered, stopped: Sequence[str] = (),
                     failed: Sequence[str] = ()) -> str:
    what = ", ".join(p.label() for p in t.processes) or "no GPU process now"
    text = (f"container {t.key.container}: {t.why}: treated as over its GPU memory budget "
            f"(its GPU processes: {what})")
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
