"""MIG instances made for claims on the GPUs of a partition with ``migMode: OnDemand`` (I/O;
which placement a device name stands for is :func:`tessera.dra.partitions.placement_of`).

The scheduler allocates a claim one of the placement devices such a GPU publishes (never two
that overlap: their shared counters); prepare makes that very instance before anything else
of the claim, and unprepare destroys it once the claim's files are gone:

* one ``nvidia-smi mig -i <gpu> -cgi <profile>:<start> -C`` (the GPU instance at the
  allocated start slot and its default compute instance in one command), under the GPU's
  host lock as every MIG command of the daemon, counted and timed as the enactor's are;
* idempotent: an instance already at that placement is the claim's (prepare is asked again
  after a kubelet restart; a daemon killed after the command left it there), one left without
  its compute instance gets it (``-cci``; the reconciler's plan for an on-demand GPU leaves
  such an instance alone, so the two never race);
* destroying (``-dci`` then ``-dgi``) leaves an instance a process still runs on: it is
  reported and stays, and the GPU offers its placements again only once it is gone.

The claim's record in the checkpoint names the instances made for it, so unprepare after a
daemon restart destroys exactly those.
"""

from __future__ import annotations

import logging
import time

from tessera_node import metrics
from tessera_node.device.state import GPUState, MigInstanceState
from tessera_node.dra.claims import MadeInstance
from tessera_node.layout.enact import SmiEnactor

log = logging.getLogger("tessera_node.dra")

def _instance(gpu: GPUState, inst: MadeInstance) -> MigInstanceState | None:
    return next((i for i in gpu.instances if (i.profile, i.start) == (inst.profile,
                                                                     inst.start)), None)


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
                have = _instance(self._gpu(inst), inst)
                if have is None:
                    self._run(inst, "create-gi", fd, "-cgi", f"{inst.profile}:{inst.start}",
                              "-C")
                elif not have.has_compute_instance:
                    self._run(inst, "create-ci", fd, "-gi", str(have.gi_id), "-cci")
                made = _instance(self._gpu(inst), inst)
                if made is None or not made.has_compute_instance:
                    raise OSError(f"{inst}: nvidia-smi succeeded but NVML does not show the "
                                  "instance with its compute instance")
        except OSError:
            metrics.MIG_ON_DEMAND.labels("create", "error").inc()
            raise
        metrics.MIG_ON_DEMAND.labels("create", "ok").inc()
        if have is None:
            metrics.MIG_ON_DEMAND_SECONDS.observe(time.monotonic() - started)
        log.info("MIG instance made for a claim", extra={
            "gpu": inst.gpu, "profile": inst.profile, "start": inst.start, "uuid": made.uuid,
            "seconds": round(time.monotonic() - started, 4), "existed": have is not None})
        return made

    def unmake(self, inst: MadeInstance) -> str | None:
        """Destroy the instance; why it stays (a process runs on it), None when it is gone.
        OSError when a command fails."""
        try:
            with self.enactor.locks.held(inst.gpu) as fd:
                have = _instance(self._gpu(inst), inst)
                if have is None:
                    return None
                if have.processes:
                    why = (f"{inst} stays: {', '.join(have.processes)} still run(s) on it; "
                           "its placements are offered again once it is gone")
                    log.warning("MIG instance of a released claim in use", extra={
                        "gpu": inst.gpu, "profile": inst.profile, "start": inst.start,
                        "processes": list(have.processes)})
                    return why
                if have.has_compute_instance:
                    self._run(inst, "destroy-ci", fd, "-gi", str(have.gi_id), "-dci")
                self._run(inst, "destroy-gi", fd, "-gi", str(have.gi_id), "-dgi")
        except OSError:
            metrics.MIG_ON_DEMAND.labels("destroy", "error").inc()
            raise
        metrics.MIG_ON_DEMAND.labels("destroy", "ok").inc()
        log.info("MIG instance of a released claim destroyed", extra={
            "gpu": inst.gpu, "profile": inst.profile, "start": inst.start})
        return None
