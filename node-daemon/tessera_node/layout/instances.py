"""MIG instances made on demand on the GPUs of a partition with ``migMode: OnDemand`` (I/O),
for DRA claims and for pods alike.

On a DRA node the scheduler allocates a claim one of the placement devices such a GPU
publishes (never two that overlap: their shared counters; which placement a device name
stands for is :func:`tessera.dra.partitions.placement_of`); prepare makes that very instance
before anything else of the claim, and unprepare destroys it once the claim's files are
gone. On a device-plugin node the operator's placement service asks an instance for a pod
no instance holds (``status.demand``, :mod:`tessera_node.layout.on_demand`); the reconciler
makes it, and destroys it once no pod holds it and nothing asks it. Either way:

* one ``nvidia-smi mig -i <gpu> -cgi <profile>:<start> -C`` (the GPU instance at the
  allocated start slot and its default compute instance in one command), under the GPU's
  host lock as every MIG command of the daemon, counted and timed as the enactor's are;
* idempotent: an instance already at that placement is the claim's (prepare is asked again
  after a kubelet restart; a daemon killed after the command left it there), one left without
  its compute instance gets it (``-cci``; the reconciler's plan for an on-demand GPU leaves
  such an instance alone, so the two never race);
* destroying (``-dci`` then ``-dgi``) leaves an instance a process still runs on: it is
  reported and stays, and the GPU offers its placements again only once it is gone.

A claim's record in the DRA checkpoint names the instances made for it, so unprepare after
a daemon restart destroys exactly those.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tessera.placement.record import PlacementRecord
from tessera_node import metrics
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState
from tessera_node.layout.advertise import Advertiser
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.enact import SmiEnactor
from tessera_node.layout.on_demand import (
    IDLE_S,
    Asked,
    MadeInstance,
    Work,
    decide,
    instance_at,
    place_of,
)

log = logging.getLogger("tessera_node.layout")


class InstanceMaker:
    def __init__(self, enactor: SmiEnactor) -> None:
        self.enactor = enactor

    def _gpu(self, inst: MadeInstance) -> GPUState:
        gpu = next((g for g in self.enactor.reader.read().gpus if g.index == inst.gpu), None)
        if gpu is None or gpu.uuid != inst.gpu_uuid:
            raise OSError(f"GPU {inst.gpu} ({inst.gpu_uuid}) is not on this node now")
        return gpu

    def _run(self, inst: MadeInstance, kind: str, fd: int, *args: str) -> None:
        r = self.enactor.call(kind, inst.gpu, fd, "mig", "-i", str(inst.gpu), *args)
        if r.rc != 0:
            words = " ".join(r.output.split())[:400] or "no output"
            raise OSError(f"`nvidia-smi mig -i {inst.gpu} {' '.join(args)}` failed "
                          f"(exit {r.rc}): {words}")

    def make(self, inst: MadeInstance) -> MigInstanceState:
        """The instance, made unless it is there already; OSError when it cannot be."""
        started = time.monotonic()
        refusal = self.enactor.refusal()
        if refusal is not None:
            metrics.MIG_ON_DEMAND.labels("create", "error").inc()
            raise OSError(f"{inst} cannot be made: {refusal}")
        try:
            with self.enactor.locks.held(inst.gpu) as fd:
                have = instance_at(self._gpu(inst), inst)
                if have is None:
                    self._run(inst, "create-gi", fd, "-cgi", f"{inst.profile}:{inst.start}",
                              "-C")
                elif not have.has_compute_instance:
                    self._run(inst, "create-ci", fd, "-gi", str(have.gi_id), "-cci")
                made = instance_at(self._gpu(inst), inst)
                if made is None or not made.has_compute_instance:
                    raise OSError(f"{inst}: nvidia-smi succeeded but NVML does not show the "
                                  "instance with its compute instance")
        except OSError:
            metrics.MIG_ON_DEMAND.labels("create", "error").inc()
            raise
        metrics.MIG_ON_DEMAND.labels("create", "ok").inc()
        if have is None:
            metrics.MIG_ON_DEMAND_SECONDS.observe(time.monotonic() - started)
        log.info("MIG instance made on demand", extra={
            "gpu": inst.gpu, "profile": inst.profile, "start": inst.start, "uuid": made.uuid,
            "seconds": round(time.monotonic() - started, 4), "existed": have is not None})
        return made

    def unmake(self, inst: MadeInstance,
               keep: Callable[[MigInstanceState], str | None] | None = None,
               withdraw: Callable[[MigInstanceState], None] | None = None) -> str | None:
        """Destroy the instance; why it stays (a process runs on it, or ``keep`` says why),
        None when it is gone. OSError when a command fails.

        ``withdraw`` (under the GPU's lock, before anything is decided): take the instance
        out of what the node advertises; it is then read again, and ``keep`` asked, right
        before the commands."""
        try:
            with self.enactor.locks.held(inst.gpu) as fd:
                have = instance_at(self._gpu(inst), inst)
                if have is None:
                    return None
                if withdraw is not None:
                    withdraw(have)
                    have = instance_at(self._gpu(inst), inst)
                    if have is None:
                        return None
                if have.processes:
                    why = (f"{inst} stays: {', '.join(have.processes)} still run(s) on it; "
                           "its placements are offered again once it is gone")
                    log.warning("MIG instance to destroy is in use", extra={
                        "gpu": inst.gpu, "profile": inst.profile, "start": inst.start,
                        "processes": list(have.processes)})
                    return why
                kept = keep(have) if keep is not None else None
                if kept is not None:
                    return f"{inst} stays: {kept}"
                if have.has_compute_instance:
                    self._run(inst, "destroy-ci", fd, "-gi", str(have.gi_id), "-dci")
                self._run(inst, "destroy-gi", fd, "-gi", str(have.gi_id), "-dgi")
        except OSError:
            metrics.MIG_ON_DEMAND.labels("destroy", "error").inc()
            raise
        metrics.MIG_ON_DEMAND.labels("destroy", "ok").inc()
        log.info("MIG instance made on demand destroyed", extra={
            "gpu": inst.gpu, "profile": inst.profile, "start": inst.start})
        return None


class PodOnNode(Protocol):
    """A pod bound to this node as the device plugin's pod watch shows it."""

    @property
    def phase(self) -> str: ...

    @property
    def placement(self) -> PlacementRecord | None: ...

    @property
    def placement_error(self) -> str | None: ...


class PodsOnNode(Protocol):
    """The device plugin's view of the node's pods (what holds its units)."""

    def views(self) -> Sequence[PodOnNode]: ...


class HoldersNow(Protocol):
    def holders(self) -> Mapping[str, Sequence[str]]: ...


class DevicePluginParts(Protocol):
    @property
    def pods(self) -> PodsOnNode: ...

    @property
    def held(self) -> HoldersNow: ...


ENDED = ("Succeeded", "Failed")


def units_held_by_pods(plugin: DevicePluginParts) -> Callable[[], frozenset[str] | None]:
    """The MIG units pods hold now, read afresh: the kubelet's allocations (PodResources, and
    allocations not confirmed yet) and the placement records of the pods bound here that have
    not ended. None (every unit held: fail closed) when either cannot be read, or a pod's
    record cannot."""
    def held() -> frozenset[str] | None:
        try:
            units = set(plugin.held.holders())
        except OSError:
            return None
        for v in plugin.pods.views():
            if v.phase in ENDED:
                continue
            if v.placement_error is not None:
                return None
            if v.placement is not None:
                units |= v.placement.units()
        return frozenset(units)
    return held


def holding(units: frozenset[str] | None) -> Callable[[MigInstanceState], bool]:
    """Whether a pod holds an instance, by ``units`` (None: every one with a compute
    instance; one without has never been given to a container)."""
    return lambda i: bool(i.uuid) and (units is None or i.uuid in units)


@dataclass
class DemandRunner:
    """Makes the on-demand instances asked for pods and destroys those nothing holds once
    idle (one batch at a time, in a thread). On a DRA node nothing is asked (prepare makes
    a claim's instance, unprepare destroys it): the runner destroys only what no claim holds
    or is allocated, such as an instance made for a claim deleted before its prepare was
    recorded."""

    maker: InstanceMaker
    advertiser: Advertiser
    held_units: Callable[[], frozenset[str] | None]
    """The units workloads hold now (a device-plugin node: :func:`units_held_by_pods`; a
    DRA node: its prepared claims'), read once per decision and again right before an
    instance is destroyed."""
    idle_s: float = IDLE_S
    keeps: Callable[[MadeInstance, MigInstanceState], str | None] | None = None
    """Asked last, under the GPU's lock, of an instance about to be destroyed as unused:
    why it must stay all the same (a DRA node: a claim allocated it and not prepared yet,
    :meth:`tessera_node.dra.service.DraPlugin.keeps_instance`); None: nothing keeps it."""
    clock: Callable[[], float] = time.monotonic
    idle_since: dict[tuple[str, str, int], float] = field(default_factory=dict)
    made_for: dict[str, str] = field(default_factory=dict)
    """MIG device UUID -> the pod (namespace/name) it was asked for."""
    _told: set[str] = field(default_factory=set)

    def decide(self, snapshot: DeviceSnapshot, targets: Mapping[str, GPUTarget],
               asked: Sequence[Asked]) -> Work:
        work = decide(snapshot, targets, asked, holding(self.held_units()), self.idle_since,
                      self.clock(), self.idle_s)
        for why in work.refused:
            if why not in self._told:
                log.warning("asked MIG instance not made", extra={"why": why})
        self._told = set(work.refused)  # said once while it lasts
        by_place = {(g.uuid, i.profile, i.start): i.uuid for g in snapshot.gpus
                    for i in g.instances if i.uuid}
        for a in asked:
            uuid = by_place.get(place_of(a.instance))
            if uuid:
                self.made_for[uuid] = a.pod
        present = set(by_place.values())  # destroyed instances are forgotten
        self.made_for = {u: p for u, p in self.made_for.items() if u in present}
        return work

    def run(self, work: Work) -> None:
        """Carry ``work`` out (a worker thread); errors are logged, the next pass retries."""
        for a in work.make:
            try:
                made = self.maker.make(a.instance)
            except OSError as exc:
                log.warning("MIG instance for a pod not made", extra={
                    "pod": a.pod, "instance": str(a.instance), "error": str(exc)[:300]})
                continue
            if made.uuid:
                self.made_for[made.uuid] = a.pod
        for inst in work.destroy:
            def keep(i: MigInstanceState, inst: MadeInstance = inst) -> str | None:
                if holding(self.held_units())(i):
                    return f"a workload holds {i.uuid}"
                return self.keeps(inst, i) if self.keeps is not None else None

            def withdraw(i: MigInstanceState, gpu: str = inst.gpu_uuid) -> None:
                if i.uuid:
                    self.advertiser.withdraw(gpu, [i.uuid])
            try:
                why = self.maker.unmake(inst, keep=keep, withdraw=withdraw)
            except OSError as exc:
                log.warning("idle MIG instance not destroyed", extra={
                    "instance": str(inst), "error": str(exc)[:300]})
                continue
            finally:
                self.advertiser.changed(inst.gpu_uuid)
            if why is None:
                self.idle_since.pop(place_of(inst), None)
            else:  # asked again after another grace, not at every pass
                self.idle_since[place_of(inst)] = self.clock()
                log.info("idle MIG instance kept", extra={"instance": str(inst), "why": why})

    def due_in(self) -> float | None:
        """Seconds until the grace of the next idle instance ends (None: none is idle): the
        reconciler looks again then, whether or not anything else changed."""
        if not self.idle_since:
            return None
        return max(0.0, min(self.idle_since.values()) + self.idle_s - self.clock())
