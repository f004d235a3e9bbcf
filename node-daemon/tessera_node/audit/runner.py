"""The audit's I/O: every ``audit_interval_s`` read the containers tessera set up, their
budget files and ledgers, NVML's per-process figures and each process's ``/proc`` entry; decide
(:mod:`tessera_node.audit.logic`, pure); set the per-container metrics; post deduplicated
Events (on the pod for a container over budget, on the Node for a foreign process) and, where
the namespace's GPUQuota says ``Stop``, kill the processes (SIGKILL, said in the Event).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tessera.api.names import GPUQUOTAS, GROUP, NODE_DAEMON, VERSION
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.events import post_event
from tessera_node import metrics
from tessera_node.audit.idle import IdleReclaim, PodKey, UnitSample
from tessera_node.audit.logic import (
    AuditedContainer,
    AuditResult,
    Confirmed,
    ContainerKey,
    Enforcement,
    Files,
    GPUProcess,
    Sees,
    Tracker,
    audit,
    enforcement_of,
    foreign_message,
    over_budget_message,
    tampered_message,
)
from tessera_node.budget.formats import read_budget_file
from tessera_node.budget.ledger import (
    FILE_SIZE,
    LedgerError,
    LedgerView,
    open_ledger,
    parse_header,
    read_ledger,
)
from tessera_node.device import procfs
from tessera_node.device.nvml import DeviceError
from tessera_node.device.procfs import process_name
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.registry import SetUpContainer

log = logging.getLogger("tessera_node.audit")

MIB = 1 << 20
REASON_OVER_BUDGET = "GPUMemoryOverBudget"
REASON_FOREIGN = "ForeignGPUProcess"
REASON_TAMPERED = "GPUBudgetTampered"
CONTAINER_FILES = ("/run/tessera/budget", "/run/tessera/ledger")
"""What a process of a container tessera set up must find in its own root: the daemon's
files (the device plugin mounts them there; libtessera reads them there)."""


class AuditDevices(Protocol):
    def read(self) -> DeviceSnapshot: ...

    def process_utilization(self, index: int, since_us: int
                            ) -> tuple[dict[int, float], int] | None: ...


@dataclass(frozen=True)
class ContainerState:
    """What the runner read of one container (budget file, ledger)."""

    spec: SetUpContainer
    view: AuditedContainer
    cores: Mapping[str, float | None]
    entry_of: Mapping[str, int]
    ledger: LedgerView | None


def read_container(c: SetUpContainer) -> ContainerState:
    """Its budget per UUID (pending, refused or unreadable: 0 everywhere), the identities of
    its budget file and of the ledger that file names, and its ledger as it is now: read, or
    why it is not the daemon's any more."""
    limits: dict[str, int | None] = {u: 0 for u in c.units}
    cores: dict[str, float | None] = {}
    entry_of: dict[str, int] = {}
    files = None
    try:
        b = read_budget_file(c.budget_file)
        st = os.stat(c.budget_file)
    except (OSError, ValueError) as exc:
        log.warning("budget file unreadable: audited as 0", extra={
            "container": f"{c.namespace}/{c.pod}/{c.container}", "error": str(exc)})
    else:
        files = Files((st.st_dev, st.st_ino), b.ledger)
        if b.state == "ready":
            for i, e in enumerate(b.entries):
                if e.uuid is not None:
                    limits[e.uuid] = e.memory
                    cores[e.uuid] = e.cores
                    entry_of[e.uuid] = i
    ledger, tampered = read_own_ledger(c.ledger, files.ledger if files else None)
    ids = frozenset((s.pid, s.start_ticks) for s in (ledger.slots if ledger else ())
                    if s.alive and s.start_ticks)
    accounted = None
    if ledger is not None:
        accounted = {u: sum(s.bytes[e] for s in ledger.slots if s.alive)
                     for u, e in entry_of.items() if e < len(ledger.devices)}
    view = AuditedContainer(ContainerKey(c.namespace, c.pod, c.container), c.pod_uid,
                            c.container_id, limits, ids, files, tampered, accounted,
                            frozenset(c.other_pod_uids))
    return ContainerState(c, view, cores, entry_of, ledger)


def read_own_ledger(path: Path, named: tuple[int, int] | None
                    ) -> tuple[LedgerView | None, str | None]:
    """(the ledger, why it is not the one the daemon made). A ledger the budget file names
    (the daemon created it at Allocate) must be that very file, of its size, a ledger; one it
    does not name (an older daemon's container: its first process creates it) may be missing
    or being created, and is only read."""
    try:
        fd = open_ledger(path)
    except LedgerError as exc:
        if named is None:
            return None, None
        return None, "its ledger is gone" if exc.missing else f"its ledger: {exc}"
    try:
        st = os.fstat(fd)
        if named is not None and (st.st_dev, st.st_ino) != named:
            return None, "its ledger was replaced by another file"
        if st.st_size != FILE_SIZE:
            what = "truncated" if st.st_size < FILE_SIZE else "grown"
            return None, (f"its ledger was {what} to {st.st_size} bytes"
                          if named is not None else None)
        parse_header(os.pread(fd, 4096, 0))
    except LedgerError as exc:
        return None, (f"its ledger: {exc}" if named is not None else None)
    finally:
        os.close(fd)
    try:
        return read_ledger(path), None
    except LedgerError as exc:  # changed since: judged at the next audit
        log.info("ledger changed while read", extra={"path": str(path), "error": str(exc)})
        return None, None


def unit_of(gpu_uuid: str, gi_id: int | None, mig_uuids: Mapping[int, str]) -> str:
    """The UUID a record's memory is on: its MIG device's, else the GPU's."""
    if gi_id is not None and gi_id in mig_uuids:
        return mig_uuids[gi_id]
    return gpu_uuid


def gpu_processes(snapshot: DeviceSnapshot, proc: Path, own_pid: int) -> list[GPUProcess]:
    """NVML's records with each process's /proc facts; the daemon and its children (the
    context probe) left out."""
    out = []
    infos: dict[int, procfs.ProcInfo] = {}
    for g in snapshot.gpus:
        migs = {i.gi_id: i.uuid for i in g.instances if i.uuid}
        for r in g.usage:
            info = infos.get(r.pid)
            if info is None:
                info = infos[r.pid] = procfs.read_proc(r.pid, proc)
            if own_pid in (r.pid, info.ppid):
                continue
            seen = None
            if info.owner is not None:  # in a pod: what it finds at /run/tessera
                found = procfs.sees(r.pid, info.start_ticks, CONTAINER_FILES, proc)
                seen = Sees(*found) if found is not None else None
            out.append(GPUProcess(r.pid, unit_of(g.uuid, r.gi_id, migs), r.used_bytes,
                                  process_name(r.pid), info.start_ticks, info.inner_pid,
                                  info.owner, info.unreadable, seen))
    return out


def idle_samples(states: Sequence[ContainerState], result: AuditResult,
                 util: Mapping[str, Mapping[int, float]]) -> list[UnitSample]:
    """Per container and unit: the memory its processes hold (NVML, as the audit attributed
    it), NVML's SM percent of those processes on a GPU (``util``: GPUs that are not
    MIG-enabled), and the kernels the container launched (its ledger)."""
    out = []
    for s in states:
        c = s.spec
        if not c.pod_uid:
            continue  # a claim no pod of this node uses (yet): no pod to act on
        pod = PodKey(c.namespace, c.pod, c.pod_uid)
        launches = s.ledger.launches if s.ledger is not None else None
        for unit in c.units:
            key = (s.view.key, unit)
            sm = None
            if unit in util:
                pids = {p.pid for p in result.held.get(key, ())}
                sm = sum(util[unit].get(pid, 0.0) for pid in pids)
            out.append(UnitSample(pod, c.container, unit, result.usage.get(key, 0), sm,
                                  launches))
    return out


class AuditRunner:
    def __init__(self, kube: Kube, node_name: str,
                 containers: Callable[[], Sequence[SetUpContainer]], devices: AuditDevices,
                 interval_s: float, slack_mib: int = 0, confirm: int = 2,
                 proc: Path = Path("/proc"), own_pid: int | None = None) -> None:
        self.kube = kube
        self.node_name = node_name
        self.containers = containers
        """The containers tessera set up on this node now (the device plugin's registry)."""
        self.devices = devices
        self.interval_s = interval_s
        self.slack_bytes = slack_mib * MIB
        self.tracker = Tracker(confirm)
        self.proc = proc
        self.own_pid = os.getpid() if own_pid is None else own_pid
        self._util_since: dict[int, int] = {}
        self._node: dict[str, Any] | None = None
        self.last: AuditResult | None = None
        self.idle = IdleReclaim(kube, interval_s)

    async def run(self) -> None:
        while True:
            await self.audit_once()
            await asyncio.sleep(self.interval_s)

    async def audit_once(self) -> Confirmed | None:
        try:
            snapshot = await asyncio.to_thread(self.devices.read)
        except DeviceError as exc:
            metrics.AUDIT_RUNS.labels("nvml_error").inc()
            log.warning("audit: cannot read the GPUs", extra={"error": str(exc)})
            return None
        states = await asyncio.to_thread(self._read_containers)
        processes = await asyncio.to_thread(gpu_processes, snapshot, self.proc, self.own_pid)
        util = await asyncio.to_thread(self._utilization, snapshot)
        result = audit([s.view for s in states], processes, self.slack_bytes)
        self.last = result
        confirmed = self.tracker.step(result)
        self._observe(states, result, util, confirmed)
        try:
            await self._act(confirmed)
            await self.idle.step(idle_samples(states, result, util))
        except (ApiError, OSError, TimeoutError) as exc:
            metrics.AUDIT_RUNS.labels("api_error").inc()
            log.warning("audit: API server", extra={"error": str(exc)[:300]})
            return confirmed
        metrics.AUDIT_RUNS.labels("ok").inc()
        return confirmed

    def _read_containers(self) -> list[ContainerState]:
        """Every container's files. A container whose allocation changed while they were read
        (its devices allocated again: new files, and the registry's entry dropped first) is
        read as having no ledger problem this time: it is judged at the next audit."""
        before = self.containers()
        states = [read_container(c) for c in before]
        now = {id(c) for c in self.containers()}
        return [s if s.view.tampered is None or id(s.spec) in now
                else dataclasses.replace(s, view=dataclasses.replace(s.view, tampered=None))
                for s in states]

    # -- metrics ------------------------------------------------------------------------------

    def _utilization(self, snapshot: DeviceSnapshot) -> dict[str, dict[int, float]]:
        """Per GPU UUID (MIG disabled), busy percent per host PID since the last audit."""
        out: dict[str, dict[int, float]] = {}
        for g in snapshot.gpus:
            if g.mig_mode == "enabled":
                continue
            try:
                got = self.devices.process_utilization(g.index,
                                                       self._util_since.get(g.index, 0))
            except DeviceError:
                continue
            if got is None:
                continue
            out[g.uuid], self._util_since[g.index] = got
        return out

    def _observe(self, states: Sequence[ContainerState], result: AuditResult,
                 util: Mapping[str, Mapping[int, float]], confirmed: Confirmed) -> None:
        over = {(f.key, f.unit) for f in result.over}
        tampered = {t.key for t, _new in confirmed.tampered}
        by_key = {s.view.key: s for s in states}
        figures = []
        for (key, unit), used in sorted(result.usage.items()):
            s = by_key[key]
            hist: tuple[int, ...] = ()
            wait = 0.0
            e = s.entry_of.get(unit)
            if s.ledger is not None and e is not None and e < len(s.ledger.devices):
                d = s.ledger.devices[e]
                hist, wait = d.wait_hist, d.wait_s
            u = None
            if unit in util:
                pids = {p.pid for p in result.held.get((key, unit), ())}
                u = sum(util[unit].get(pid, 0.0) for pid in pids)
            figures.append(metrics.ContainerFigures(
                key.namespace, key.pod, key.container, unit, used, s.view.limits.get(unit, 0),
                s.cores.get(unit), u, hist, wait, (key, unit) in over, key in tampered,
                (s.spec.claim or "").split("/", 1)[-1]))
        metrics.CONTAINERS.set(figures)
        metrics.AUDIT_FOREIGN.clear()
        metrics.AUDIT_FOREIGN_BYTES.clear()
        for p, _new in confirmed.foreign:
            metrics.AUDIT_FOREIGN.labels(p.unit).inc()
            metrics.AUDIT_FOREIGN_BYTES.labels(p.unit).inc(p.used_bytes or 0)

    # -- Events and stops ---------------------------------------------------------------------

    async def _act(self, confirmed: Confirmed) -> None:
        policies: dict[str, Enforcement | None] = {}
        pods: dict[str, tuple[str, str]] | None = None
        for t, new in confirmed.tampered:
            pol = await self._enforcement(t.key.namespace, policies)
            stopped: list[str] = []
            failed: list[str] = []
            if pol is not None and pol.over_budget == "Stop" and t.processes:
                stopped, failed = await self._stop(t.processes, "tampered")
            if new or stopped:
                log.warning("a container tampered with its budget files", extra={
                    "container": str(t.key), "why": t.why, "stopped": stopped,
                    "failed": failed})
                await self._pod_event(t.key, t.pod_uid, REASON_TAMPERED,
                                      tampered_message(t, stopped, failed))
        done = {t.key for t, _new in confirmed.tampered}  # stopped as tampering already
        for f, new in confirmed.over:
            pol = await self._enforcement(f.key.namespace, policies)
            stopped, failed = [], []
            if pol is not None and pol.over_budget == "Stop" and f.key not in done:
                stopped, failed = await self._stop(f.processes, "over_budget")
            if new or stopped:
                log.warning("container over its GPU memory budget", extra={
                    "container": str(f.key), "gpu": f.unit, "used": f.used,
                    "budget": f.limit, "stopped": stopped, "failed": failed})
                await self._pod_event(f.key, f.pod_uid, REASON_OVER_BUDGET,
                                      over_budget_message(f, stopped, failed))
        for p, new in confirmed.foreign:
            if pods is None and p.owner is not None:
                pods = await self._pods_here()
            where = (pods or {}).get(p.owner.pod_uid) if p.owner else None
            stopped, failed = [], []
            if where is not None and p.unreadable is None and p.start_ticks is not None:
                pol = await self._enforcement(where[0], policies)
                if pol is not None and pol.foreign_processes == "Stop":
                    stopped, failed = await self._stop([p], "foreign")
            if new or stopped:
                pod = f"{where[0]}/{where[1]}" if where else None
                log.warning("GPU process outside tessera", extra={
                    "pid": p.pid, "gpu": p.unit, "pod": pod, "stopped": stopped})
                await self._node_event(foreign_message(p, pod, stopped, failed))

    async def _stop(self, processes: Sequence[GPUProcess], kind: str
                    ) -> tuple[list[str], list[str]]:
        stopped, failed = [], []
        for p in processes:
            if p.start_ticks is None:
                failed.append(f"{p.label()}: start time unknown")
                continue
            why = await asyncio.to_thread(procfs.stop, p.pid, p.start_ticks, self.proc)
            if why is None:
                stopped.append(p.label())
                metrics.AUDIT_STOPS.labels(kind, "ok").inc()
            else:
                failed.append(why)
                metrics.AUDIT_STOPS.labels(kind, "failed").inc()
        return stopped, failed

    async def _enforcement(self, namespace: str, cache: dict[str, Enforcement | None]
                           ) -> Enforcement | None:
        """The namespace's enforcement; None when its quotas cannot be read (then nothing is
        stopped: a kill needs a policy read, not assumed)."""
        if namespace not in cache:
            try:
                body = await self.kube.list(path(GROUP, VERSION, GPUQUOTAS, namespace))
                cache[namespace] = enforcement_of(body.get("items") or [])
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("audit: cannot read GPUQuotas", extra={
                    "namespace": namespace, "error": str(exc)[:300]})
                cache[namespace] = None
        return cache[namespace]

    async def _pods_here(self) -> dict[str, tuple[str, str]]:
        """Pod UID -> (namespace, name) of the pods bound to this node."""
        try:
            body = await self.kube.request(
                "GET", path("", "v1", "pods"),
                params={"fieldSelector": f"spec.nodeName={self.node_name}"})
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("audit: cannot list this node's pods", extra={"error": str(exc)[:300]})
            return {}
        out = {}
        for item in body.get("items") or []:
            m = item.get("metadata") or {}
            out[str(m.get("uid"))] = (str(m.get("namespace")), str(m.get("name")))
        return out

    async def _pod_event(self, key: ContainerKey, pod_uid: str, reason: str,
                         message: str) -> None:
        obj = {"metadata": {"name": key.pod, "namespace": key.namespace, "uid": pod_uid}}
        metrics.API_WRITES.labels("event").inc()
        await post_event(self.kube, obj, "v1", "Pod", reason, message, "Warning", NODE_DAEMON)

    async def _node_event(self, message: str) -> None:
        if self._node is None:
            try:
                self._node = await self.kube.get(path("", "v1", "nodes", name=self.node_name))
            except (ApiError, OSError, TimeoutError):
                self._node = None
        obj = self._node or {"metadata": {"name": self.node_name}}
        metrics.API_WRITES.labels("event").inc()
        await post_event(self.kube, obj, "v1", "Node", REASON_FOREIGN, message, "Warning",
                         NODE_DAEMON)

