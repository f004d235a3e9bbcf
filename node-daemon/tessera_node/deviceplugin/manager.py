"""The device plugin's resource manager: the node's units, the budget files, and the pods
they belong to. It calls the pure modules and the budget writer; the gRPC servers call it.

``resolve`` is the periodic step (every second while an allocation is pending): it takes one
PodResources ``List``, confirms pending allocations (budget ready, or refused with an Event
when memory would overcommit or the pod has no budget), and removes the files of
allocations whose pods have ended (deleted, or Succeeded/Failed, and no longer listed by the
kubelet). Its caller must know the node's pods (the pod watch listed): a pod missing from
``pods`` counts as ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.api.budget import BudgetAnnotation, BudgetAnnotationError, PerShareBudget
from tessera.api.names import VGPU
from tessera_node.budget.writer import AllocationRecord, BudgetWriter
from tessera_node.container.device_files import DeviceFilesError
from tessera_node.container.response import (
    ContainerResponse,
    HostPaths,
    SimPaths,
    Visibility,
    container_response,
)
from tessera_node.container.sim_files import SimDeviceFiles
from tessera_node.deviceplugin import budgets, fit, pending, placed, resize
from tessera_node.deviceplugin.allocation import Policy, decide, preferred, roomy
from tessera_node.deviceplugin.devices import (
    PluginDevice,
    Sharing,
    Unit,
    advertised,
)
from tessera_node.deviceplugin.matcher import (
    ENDED,
    ContainerRef,
    Held,
    PodView,
    allocation_key,
    candidates,
    confirm,
)
from tessera_node.deviceplugin.registry import ContainerRegistry, SetUpContainer
from tessera_node.deviceplugin.server import AllocateError

log = logging.getLogger("tessera_node.deviceplugin")

Refused = Callable[[PodView, str, str], None]
"""(pod, container, reason): the daemon posts an Event on the pod."""


@dataclass
class PluginConfig:
    node: str
    shares_per_unit: int
    lib_dir: str
    visibility: Visibility
    forget_after_s: float
    """A pending allocation the kubelet never shows as held is removed after this long
    (``settings.FORGET_PENDING_S``)."""
    policy: Policy = "pack"
    sim: SimPaths | None = None


@dataclass
class NodeState:
    units: list[Unit] = field(default_factory=list)
    sharing: Mapping[str, Sharing] = field(default_factory=dict)
    profiles: frozenset[str] = frozenset()
    context_bytes: Mapping[str, int] = field(default_factory=dict)


class Manager:
    def __init__(
        self,
        config: PluginConfig,
        writer: BudgetWriter,
        pods: Callable[[], Iterable[PodView]],
        on_refused: Refused,
        registry: ContainerRegistry | None = None,
    ) -> None:
        self.config = config
        self.writer = writer
        self.pods = pods
        self.on_refused = on_refused
        self.registry = registry or ContainerRegistry()
        self.state = NodeState()
        self._lock = threading.Lock()
        self._matched: dict[str, ContainerRef] = {}
        self._refused: dict[str, str] = {}
        """Allocation key -> why its budget is refused now."""
        self._ready_cache: dict[str, list[tuple[str, int | None]]] | None = None
        self._tentative: dict[str, pending.Tentative] = {}
        """Allocations not confirmed yet -> the candidate each is tentatively for."""
        self._sim_files = SimDeviceFiles(config.visibility, config.sim)
        """The simulated driver's capability table (``sim`` visibility), once read."""

    # -- what is advertised ------------------------------------------------------------
    def update(self, state: NodeState) -> None:
        with self._lock:
            self.state = state

    def advertised(self) -> dict[str, list[PluginDevice]]:
        s = self.state
        return advertised(s.units, self.config.shares_per_unit, s.sharing, s.profiles)

    def resource(self, name: str) -> ResourcePlugin:
        return ResourcePlugin(self, name)

    # -- Allocate ------------------------------------------------------------------------
    def allocate(self, resource: str, device_ids: Sequence[str]) -> ContainerResponse:
        with self._lock:
            devices = self.advertised().get(resource, [])
            decision = decide(device_ids, devices)
            if decision.error:
                raise AllocateError(decision.error)
            files = self._device_files(decision.units)
            matched = frozenset(self._matched.values())
            pods = self.pods()
            cands = candidates(pods, self.config.node, resource, len(device_ids), matched)
            fits = [(p, c) for p, c in cands
                    if self._candidate_fits(p, c, resource, decision.units) is None]
            key = allocation_key(resource, device_ids)
            taken = pending.taken({k: t for k, t in self._tentative.items() if k != key})
            nxt = pending.next_up(cands, taken)  # the pod the kubelet is admitting
            why = None if nxt is None else placed.check(*nxt, resource, decision.units)
            if not fits or (why and pending.next_up(fits, taken) is None):
                raise AllocateError(why or (
                    f"no pending pod on {self.config.node} asking for {len(device_ids)} "
                    f"{resource} fits these devices"))
            unconfirmed = pending.held(self._tentative, pods, self._unit_memory(), skip=key)
            p, c = pending.owner(fits, taken, lambda p, c: self._candidate_fits(
                p, c, resource, decision.units, unconfirmed) is None)
            self._tentative[key] = pending.Tentative(
                (ContainerRef(p.namespace, p.name, c),
                 *(self._tentative[key].refs if key in self._tentative else ())),
                decision.units, budgets.per_unit(p.annotations, c, resource))
            self._matched.pop(key, None)
            self._refused.pop(key, None)
            self._ready().pop(key, None)
            self.registry.drop(key)  # before its files change: not the container set up now
            try:
                self.writer.allocate(key, resource, list(device_ids), list(decision.units))
            except OSError as exc:
                self._tentative.pop(key, None)
                raise AllocateError(f"cannot write the container's budget file under "
                                    f"{self.writer.root}: {exc}") from exc
            return container_response(
                HostPaths(self.config.lib_dir, str(self.writer.budget_path(key)),
                          str(self.writer.ledger_path(key)), str(self.writer.marker)),
                decision.units, self.config.visibility, self.config.sim, files,
            )

    def _device_files(self, units: Sequence[str]) -> tuple[str, ...]:
        try:
            return self._sim_files.of(units, self.state.units)
        except DeviceFilesError as exc:
            raise AllocateError(f"device files: {exc}") from exc

    def _held(self, exclude: str | set[str] | None = None) -> dict[str, list[int]]:
        """Memory budgeted per unit by ready allocations (a whole instance: all of it),
        but those of ``exclude``."""
        mem = self._unit_memory()
        skip = {exclude} if isinstance(exclude, str) else (exclude or set())
        held: dict[str, list[int]] = {}
        for key, entries in self._ready().items():
            if key in skip:
                continue
            for uuid, memory in entries:
                held.setdefault(uuid, []).append(
                    memory if memory is not None else (mem.get(uuid) or 0))
        return held

    def _ready(self) -> dict[str, list[tuple[str, int | None]]]:
        """Ready allocations' (unit, memory budget) entries, kept in memory (read from disk
        once, after a restart): every Allocate checks them, and reading every budget file
        each time cost milliseconds per Allocate on a busy node."""
        if self._ready_cache is None:
            cache: dict[str, list[tuple[str, int | None]]] = {}
            for rec in self.writer.records():
                b = self.writer.read(rec.key)
                if b.state == "ready":
                    cache[rec.key] = [(e.uuid, e.memory) for e in b.entries
                                      if e.uuid is not None]
            self._ready_cache = cache
        return self._ready_cache

    def _candidate_fits(self, pod: PodView, container: str, resource: str,
                        units: Sequence[str], more: Mapping[str, Sequence[int]] | None = None
                        ) -> str | None:
        """None when a candidate container may have these units (its placement record's, if
        it has one) and its budget would fit them (beside ``more`` too), else why not."""
        why = placed.check(pod, container, resource, units)
        if why is not None:
            return why
        try:
            b = budgets.container_budget(pod.annotations, container)
        except BudgetAnnotationError as exc:
            return str(exc)
        return self._fits(b, resource, units, more=more)

    def _unit_memory(self) -> dict[str, int | None]:
        return {u.uuid: u.memory_bytes for u in self.state.units}

    def _fits(self, b: PerShareBudget, resource: str, units: Sequence[str],
              exclude: str | None = None, more: Mapping[str, Sequence[int]] | None = None
              ) -> str | None:
        """None when the container's budget fits beside the ready ones (and ``more``), else
        why not."""
        whole = resource != VGPU
        if not whole and b.shares != len(units):
            return f"budget is for {b.shares} shares, the container got {len(units)}"
        mem = self._unit_memory()
        want = [budgets.memory_wanted(b, whole, mem.get(u)) for u in units]
        if any(w is None for w in want):
            return "memory of a device is unknown"
        held = pending.merged(self._held(exclude), more or {})
        for u, w in zip(units, want, strict=True):
            why = fit.overcommit([u], w or 0, mem, held)
            if why:
                return why
        return None

    # -- the periodic step ---------------------------------------------------------------
    def resolve(self, listing: Sequence[Held], now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            records = {r.key: r for r in self.writer.records()}
            held = confirm(listing, {k: r.created for k, r in records.items()})
            pods = {(p.namespace, p.name): p for p in self.pods()}
            for key, ref in held.items():
                if self._matched.get(key) == ref and key not in self._refused:
                    continue
                # a refused container is judged again every period: what refused it (its pod
                # not seen yet, a GPU full of other budgets) may have passed, and its next
                # process, or the container restarted, then runs under its budget
                self._confirm(records[key], ref, pods.get((ref.namespace, ref.pod)))
            for key, rec in records.items():
                if key in held:
                    continue
                owner = self._matched.get(key)
                if owner is None:
                    if now - rec.created <= self.config.forget_after_s:
                        continue
                    why = "never confirmed"
                else:
                    # The kubelet lists nothing for a moment after it restarts: a container's
                    # files go only once its pod has ended (removing a file a running
                    # container has a mount on would detach that mount, budget and all).
                    pod = pods.get((owner.namespace, owner.pod))
                    if pod is not None and pod.phase not in ENDED:
                        continue
                    why = "pod ended"
                self._matched.pop(key, None)
                self._refused.pop(key, None)
                self._tentative.pop(key, None)
                self.registry.drop(key)
                self._ready().pop(key, None)
                self.writer.remove(key)
                log.info("allocation removed", extra={"key": key, "why": why})

    def _confirm(self, rec: AllocationRecord, ref: ContainerRef, pod: PodView | None) -> None:
        self._matched[rec.key] = ref
        self._tentative.pop(rec.key, None)
        if pod is None:
            self._refuse(rec, ref, None, f"pod {ref.namespace}/{ref.pod} not found")
            return
        try:  # the pod's annotation, parsed once for this confirmation
            annotation = budgets.pod_budget(pod.annotations)
            b = budgets.budget_for(annotation, ref.container)
        except BudgetAnnotationError as exc:
            self._refuse(rec, ref, pod, str(exc))
            return
        why = (placed.check(pod, ref.container, rec.resource, rec.units)
               or self._fits(b, rec.resource, rec.units, exclude=rec.key))
        if why is not None:
            self._refuse(rec, ref, pod, why)
            return
        if self._refused.pop(rec.key, None) is not None:
            log.info("a refused container's budget fits now", extra={"key": rec.key})
        entries = budgets.entries(b, rec.units, rec.resource != VGPU, self.state.context_bytes)
        self.writer.ready(rec.key, entries)
        self._ready()[rec.key] = [(e.uuid, e.memory) for e in entries if e.uuid is not None]
        self._register(rec, ref, pod.uid, b, None, annotation, pod)

    def _refuse(self, rec: AllocationRecord, ref: ContainerRef, pod: PodView | None,
                why: str) -> None:
        """Refuse the container's budget (once per reason: no file rewrite, no Event, while
        the same reason holds period after period)."""
        if self._refused.get(rec.key) == why:
            return
        self._refused[rec.key] = why
        self._ready().pop(rec.key, None)
        self.writer.refuse(rec.key, why)
        self._register(rec, ref, pod.uid if pod is not None else "", None, why, view=pod)
        if pod is not None:
            self.on_refused(pod, ref.container, why)

    def _register(self, rec: AllocationRecord, ref: ContainerRef, uid: str,
                  budget: PerShareBudget | None, refused: str | None,
                  annotation: BudgetAnnotation | None = None, view: PodView | None = None
                  ) -> None:
        gpu_of = {u.uuid: u.gpu_uuid for u in self.state.units}
        self.registry.put(SetUpContainer(
            key=rec.key, pod_uid=uid, namespace=ref.namespace, pod=ref.pod,
            container=ref.container, resource=rec.resource, units=rec.units,
            gpus=tuple(gpu_of.get(u, u) for u in rec.units), budget=budget, refused=refused,
            budget_file=str(self.writer.budget_path(rec.key)),
            ledger_dir=str(self.writer.ledger_dir(rec.key)),
            quota=annotation.quota if annotation is not None else None,
            weight=annotation.weight if annotation is not None else 1,
            lending=annotation.lending if annotation is not None else True,
            container_id=view.container_ids.get(ref.container) if view is not None else None,
        ))

    # -- live resize -----------------------------------------------------------------------
    def resize(self, pod: PodView) -> resize.PodOutcome | None:
        """Decide an approved resize of ``pod`` for its containers budgeted here (whole MIG
        instances have no budget to resize), and on ``Applied`` rewrite their budget files.
        None: nothing to decide (no approved request, or none of its containers confirmed
        here yet: a container confirmed later gets the new budget from the annotation)."""
        if resize.awaiting(pod.annotations) is None:
            return None
        with self._lock:
            records = {r.key: r for r in self.writer.records()}
            ready = self._ready()
            mine = sorted(
                ((key, ref) for key, ref in self._matched.items()
                 if ref.namespace == pod.namespace and ref.pod == pod.name and key in ready
                 and key in records and records[key].resource == VGPU),
                key=lambda kr: (kr[1].container, kr[0]))
            placed = [resize.Placed(key, ref.container, records[key].units,
                                    tuple(self.writer.read(key).entries))
                      for key, ref in mine]
            mem = self._unit_memory()
            elsewhere = self._held(exclude={key for key, _ in mine})
            outcome = resize.decide_pod(pod.annotations, placed, mem, elsewhere)
            if outcome is None or not outcome.applied:
                return outcome
            new = outcome.budget
            assert new is not None  # applied: the annotation it was decided from
            for key, ref in mine:
                entries = outcome.entries[key]
                self.writer.ready(key, entries)
                ready[key] = [(e.uuid, e.memory) for e in entries if e.uuid is not None]
                self._register(records[key], ref, pod.uid, new.containers[ref.container],
                               None, new, pod)
            return outcome

    def commitments(self) -> str:
        """``tessera.dev/gpu-commitments``: per unit, its memory and the budgets held there."""
        with self._lock:
            return resize.commitments(self._unit_memory(),
                                      self._held())

    def preferred(self, resource: str, available: Sequence[str], must_include: Sequence[str],
                  size: int) -> list[str]:
        """GetPreferredAllocation for the container the kubelet is allocating (the first
        candidate without an allocation): its recorded units if tessera placed it, else the
        policy's choice among the units whose memory not yet budgeted (confirmed,
        allocated but not confirmed, or recorded for pods not allocated yet) holds its
        budget; among all units when too few do."""
        with self._lock:
            gpu_of = {u.uuid: u.gpu_uuid for u in self.state.units}
            pods = self.pods()
            cands = candidates(pods, self.config.node, resource, size,
                               frozenset(self._matched.values()))
            taken = pending.taken(self._tentative)
            nxt = pending.next_up(cands, taken)
            units = None if nxt is None else placed.recorded(nxt[0], nxt[1], resource)
            if units is not None:
                return placed.offer(units, available, must_include, size)
            mem = self._unit_memory()
            free = fit.free_memory(
                {u: m for u, m in mem.items() if m is not None},
                pending.merged(self._held(), pending.held(self._tentative, pods, mem),
                               placed.reserved(pods, self.config.node, resource,
                                               taken | frozenset(self._matched.values()),
                                               mem)))
            need = None if nxt is None else budgets.per_unit(nxt[0].annotations, nxt[1], resource)
            if need:
                available = roomy(available, must_include, size, free, need)
            return preferred(available, must_include, size, gpu_of, self.config.policy, free)

    def knows_next(self, resource: str, size: int) -> bool:
        """Whether a candidate without an allocation asks for ``size`` of ``resource`` (the
        pod watch has shown the pod the kubelet is admitting)."""
        with self._lock:
            cands = candidates(self.pods(), self.config.node, resource, size,
                               frozenset(self._matched.values()))
            return pending.next_up(cands, pending.taken(self._tentative)) is not None

    def confirmed(self) -> tuple[frozenset[ContainerRef], frozenset[ContainerRef]]:
        """(containers an allocation is confirmed for, those among them refused)."""
        with self._lock:
            return (frozenset(self._matched.values()),
                    frozenset(self._matched[k] for k in self._refused if k in self._matched))

    def pending_keys(self) -> dict[str, float]:
        """Allocations the kubelet's PodResources has not shown held yet, with when each
        was made (wall clock)."""
        with self._lock:
            return {r.key: r.created for r in self.writer.records()
                    if r.key not in self._matched}

    def unconfirmed_units(self) -> set[str]:
        """Units of allocations the kubelet's PodResources has not shown held yet."""
        with self._lock:
            return {u for r in self.writer.records() if r.key not in self._matched
                    for u in r.units}

    def pending(self) -> bool:
        with self._lock:
            return any(r.key not in self._matched for r in self.writer.records())


class ResourcePlugin:
    """One resource of the manager, as a plugin server sees it."""

    def __init__(self, manager: Manager, name: str) -> None:
        self.manager = manager
        self.name = name

    def devices(self) -> list[PluginDevice]:
        return self.manager.advertised().get(self.name, [])

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int
                  ) -> list[str]:
        return self.manager.preferred(self.name, available, must_include, size)

    def allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        return self.manager.allocate(self.name, device_ids)
