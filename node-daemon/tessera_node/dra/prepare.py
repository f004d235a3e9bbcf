"""Prepare and unprepare claims on this node (I/O; the decisions are :mod:`.claims` and
:mod:`.cdi`'s).

What prepare makes for a claim, all named by its UID, so unprepare finds it even when the
checkpoint lost it (a daemon killed between writing the files and the checkpoint):

* ``<state dir>/claims/<uid>/``: the budget file (one entry per unit, ready at once: the
  budget is the allocated capacity, no pod to wait for) and the ledger (``run/ledger``),
  beside tessera's marker ``<state dir>/claims/managed`` (:mod:`tessera_node.budget.writer`);
* ``<CDI dir>/gpu.tessera.dev-claim-<uid>.json``: the CDI spec (:mod:`.cdi`);
* the claim in the checkpoint (:mod:`.checkpoint`), written first, with its namespace's
  GPUQuota's weight and lending as they were then (read once, as a pod's at admission).

Prepare again (the kubelet asks after its own restart, or a new pod sandbox after a reboot)
answers from the checkpoint, writes the budget file's entries again in place (a container
has that very file mounted: it is never replaced) or creates it when it is gone, and writes
the CDI spec again (``/var/run/cdi`` is a tmpfs). Calls are serialized.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from tessera.api.inventory import GPUInventory
from tessera.api.names import DRA_DRIVER
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container.device_files import DeviceFilesError, Unit
from tessera_node.container.response import (
    ContainerResponse,
    HostPaths,
    SimPaths,
    Visibility,
    container_response,
)
from tessera_node.container.sim_files import SimDeviceFiles
from tessera_node.dra import cdi
from tessera_node.dra.checkpoint import Checkpoint, PreparedClaim
from tessera_node.dra.claims import (
    ClaimError,
    OnDemandGPUs,
    UnitBudget,
    allocation,
    entries,
    results,
    wanted_instances,
)
from tessera_node.dra.containers import ClaimPolicy
from tessera_node.dra.files import write_atomically
from tessera_node.dra.resize import beside_prepared, resized_entries
from tessera_node.layout.on_demand import MadeInstance

log = logging.getLogger("tessera_node.dra")

_UID = re.compile(r"^[0-9a-f][0-9a-f-]{0,63}$")
"""A Kubernetes UID as the kubelet sends it (it names files: never a path)."""


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as the kubelet is answered."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    share_id: str | None


@dataclass(frozen=True)
class DraConfig:
    node: str
    lib_dir: str
    """The installed libtessera's versioned directory."""
    visibility: Visibility
    cdi_dir: str
    sim: SimPaths | None = None


ReadClaim = Callable[[str, str], dict[str, Any]]
"""(namespace, name) -> the ResourceClaim; ClaimError when it is not there, OSError when the
API server cannot be asked now."""

ReadPolicy = Callable[[str], ClaimPolicy]
"""namespace -> what its GPUQuota says of core time; ClaimError when a GPUQuota cannot be
read, OSError when the API server cannot be asked now."""


class Maker(Protocol):
    """Makes and destroys the MIG instances of on-demand GPUs
    (:class:`tessera_node.layout.instances.InstanceMaker`)."""

    def make(self, inst: MadeInstance) -> object: ...

    def unmake(self, inst: MadeInstance) -> str | None: ...


SEEN_WAIT_S = 30.0
"""How long prepare waits for the node's view (its next NVML read) to show an instance it
made; past it the kubelet is told to try again."""


class NodeView:
    """What the plugin knows of the node: its GPUs with the units they offer (the inventory
    the daemon publishes) and, for the ``sim`` visibility, the units' device numbers."""

    def __init__(self, gpus: Callable[[], Sequence[GPUInventory] | None],
                 units: Callable[[], Sequence[Unit]] = lambda: ()) -> None:
        self.gpus = gpus
        self.units = units


class ClaimPreparer:
    def __init__(self, config: DraConfig, writer: BudgetWriter, checkpoint: Checkpoint,
                 read_claim: ReadClaim, node: NodeView,
                 read_policy: ReadPolicy = lambda namespace: ClaimPolicy(),
                 on_change: Callable[[], None] = lambda: None,
                 maker: Maker | None = None,
                 on_demand: OnDemandGPUs = lambda: {}) -> None:
        """``on_change``: told after a claim was unprepared or resized (its thread);
        ``maker`` and ``on_demand``: the MIG instances of the node's GPUs in migMode
        OnDemand (None: none can be made here, a claim for one fails)."""
        self.config = config
        self.maker = maker
        self.on_demand = on_demand
        self.on_change = on_change
        self.writer = writer
        self.checkpoint = checkpoint
        self.read_claim = read_claim
        self.read_policy = read_policy
        self.node = node
        self.sim_files = SimDeviceFiles(config.visibility, config.sim)
        self._lock = threading.Lock()

    def spec_path(self, uid: str) -> Path:
        return Path(self.config.cdi_dir) / cdi.file_name(uid)

    # -- prepare -----------------------------------------------------------------------------

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        """The claim's devices with their CDI IDs; ClaimError (the claim fails, with the
        reason) or OSError (the same, to be retried by the kubelet)."""
        _check_uid(ref.uid)
        with self._lock:
            record = self.checkpoint.get(ref.uid)
            new = record is None
            if record is None:
                record = self._decide(ref)
                self.checkpoint.put(record)
            try:
                response = self._write(record)
            except (ClaimError, OSError):
                if new:  # nothing of it was handed out: leave nothing behind
                    self._remove(ref.uid)
                raise
            if new and record.made:
                self.on_change()  # the node's report names the instances' claim
            ids = tuple(cdi.device_ids(record.uid, response))
            return [PreparedDevice((r.request,), r.pool, r.device, ids, r.share_id)
                    for r in record.results]

    def _decide(self, ref: ClaimRef) -> PreparedClaim:
        claim = self.read_claim(ref.namespace, ref.name)
        uid = (claim.get("metadata") or {}).get("uid")
        if uid != ref.uid:
            raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name} is another claim now "
                             f"(UID {uid}, the kubelet asked for {ref.uid})")
        made = self._make(ref, claim)
        try:
            gpus = self._seen(made)
            alloc = allocation(claim, self.config.node, gpus)
            why = beside_prepared(gpus, alloc.units, self.checkpoint.claims())
            if why is not None:
                raise ClaimError(f"ResourceClaim {ref.namespace}/{ref.name}: {why}; the "
                                 "kubelet tries again")
            policy = self.read_policy(ref.namespace)
        except (ClaimError, OSError):
            self._unmake(made)  # nothing of the claim was handed out
            raise
        return PreparedClaim(ref.uid, ref.namespace, ref.name, alloc.results, alloc.units,
                             policy.quota, policy.weight, policy.lending, made=made)

    def _make(self, ref: ClaimRef, claim: Mapping[str, Any]) -> tuple[MadeInstance, ...]:
        """The MIG instances the claim's placements on on-demand GPUs ask, made."""
        gpus = self.on_demand()
        wanted = wanted_instances(results(claim), self.config.node, gpus) if gpus else []
        if not wanted:
            return ()
        name = f"ResourceClaim {ref.namespace}/{ref.name}"
        if self.maker is None:
            raise ClaimError(f"{name}: node {self.config.node} cannot make MIG instances "
                             "(its daemon changes no MIG layout); the kubelet tries again")
        for c in self.checkpoint.claims():
            taken = set(c.made) & set(wanted)
            if taken:
                raise ClaimError(f"{name}: {min(taken, key=str)} is ResourceClaim "
                                 f"{c.namespace}/{c.name}'s; delete this claim so that it is "
                                 "allocated again")
        made: list[MadeInstance] = []
        try:
            for w in wanted:
                self.maker.make(w)
                made.append(w)
        except OSError:
            self._unmake(tuple(made))
            raise
        return tuple(made)

    def _seen(self, made: tuple[MadeInstance, ...]) -> Sequence[GPUInventory]:
        """The node's GPUs once they show every instance in ``made`` as a unit."""
        deadline = time.monotonic() + SEEN_WAIT_S
        while True:
            gpus = self.node.gpus()
            if gpus is None:
                raise ClaimError(f"node {self.config.node}: its GPUs are not read yet; "
                                 "the kubelet tries again")
            shown = {(g.index, u.profile, u.start) for g in gpus for u in g.units or ()}
            if all((m.gpu, m.profile, m.start) in shown for m in made):
                return gpus
            if time.monotonic() > deadline:
                raise OSError(f"{', '.join(map(str, made))}: made, but not read back from "
                              f"NVML within {SEEN_WAIT_S:.0f}s; the kubelet tries again")
            time.sleep(0.05)

    def _unmake(self, made: Sequence[MadeInstance]) -> None:
        """Destroy instances made for a claim; OSError when one cannot be (one a process
        still runs on stays, said in the log)."""
        if self.maker is None:
            return
        for m in made:
            self.maker.unmake(m)

    def _write(self, record: PreparedClaim) -> ContainerResponse:
        uid = record.uid
        uuids = [u.uuid for u in record.units]
        if not self.writer.budget_path(uid).exists():
            self.writer.allocate(uid, DRA_DRIVER, [r.device for r in record.results], uuids)
        self.writer.ready(uid, entries(record.units))
        response = container_response(
            HostPaths(self.config.lib_dir, str(self.writer.budget_path(uid)),
                      str(self.writer.ledger_path(uid)), str(self.writer.marker)),
            uuids, self.config.visibility, self.config.sim, self._device_files(uuids))
        write_atomically(self.spec_path(uid), json.dumps(cdi.spec(uid, response), indent=1))
        log.info("claim prepared", extra={"claim": f"{record.namespace}/{record.name}",
                                          "uid": uid, "units": uuids})
        return response

    def rebudget(self, uid: str, units: tuple[UnitBudget, ...]) -> bool:
        """A live resize's new budget for a prepared claim: kept in the checkpoint first (a
        restarted daemon keeps it, and the capacity it takes stays unpublished), then written
        into its budget file in place (its containers obey from their next GPU call).
        Idempotent; False when the claim is not prepared (any more)."""
        _check_uid(uid)
        with self._lock:
            record = self.checkpoint.get(uid)
            if record is None:
                return False
            if units != record.units:
                allocated = record.allocation
                self.checkpoint.put(replace(record, units=units,
                                            allocated=None if units == allocated else allocated))
            self.writer.ready(uid, resized_entries(units, self.writer.read(uid).entries))
            self.on_change()
            log.info("claim budget resized", extra={
                "claim": f"{record.namespace}/{record.name}", "uid": uid,
                "units": [(u.uuid, u.memory, u.cores) for u in units]})
            return True

    def _device_files(self, uuids: Sequence[str]) -> tuple[str, ...]:
        try:
            return self.sim_files.of(uuids, self.node.units())
        except DeviceFilesError as exc:
            raise ClaimError(f"device files of {list(uuids)}: {exc}") from exc

    # -- unprepare ---------------------------------------------------------------------------

    def unprepare(self, uid: str) -> None:
        """Remove what prepare made for the claim (nothing, for a claim it never saw): its
        files, then the MIG instances made for it, then its record (OSError when an
        instance cannot be destroyed: the kubelet asks again, and the record says which)."""
        _check_uid(uid)
        with self._lock:
            self._remove(uid)
            log.info("claim unprepared", extra={"uid": uid})
        self.on_change()

    def _remove(self, uid: str) -> None:
        self.spec_path(uid).unlink(missing_ok=True)
        if (self.writer.root / uid).exists():
            self.writer.remove(uid)
        record = self.checkpoint.get(uid)
        if record is not None:
            self._unmake(record.made)
        self.checkpoint.drop(uid)


def _check_uid(uid: str) -> None:
    if not _UID.match(uid):
        raise ClaimError(f"{uid!r} is not a claim UID")
