"""The DRA kubelet plugin inside tessera-node (the supervised task ``dra-plugin``, with
``--dra``): libtessera installed, the claims' checkpoint read, both sockets served, and
served again when one of them is gone. The kubelet's calls arrive in gRPC threads; the
ResourceClaims they name are read with the daemon's API client on its event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera.api.inventory import GPUInventory
from tessera.api.names import GPUQUOTAS, GROUP, VERSION
from tessera.kube.client import ApiError, Kube, path
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container import library
from tessera_node.container.response import SimPaths
from tessera_node.device.state import MigInstanceState
from tessera_node.deviceplugin.devices import Unit
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_node.dra.checkpoint import Checkpoint
from tessera_node.dra.claims import (
    ClaimError,
    OnDemandGPUs,
    allocated_placements,
    allocated_units,
)
from tessera_node.dra.containers import ClaimPolicy, claim_containers, claim_policy, users_by_claim
from tessera_node.dra.prepare import ClaimPreparer, DraConfig, Maker, NodeView
from tessera_node.dra.server import DraServer
from tessera_node.layout.holders import Holders
from tessera_node.layout.on_demand import MadeInstance, place_of
from tessera_node.settings import (
    CLAIM_READ_TIMEOUT_S,
    CLAIMS_DIR,
    DRA_CHECKPOINT,
    LIB_DIR,
    Options,
)

log = logging.getLogger("tessera_node.dra")

CHECK_SOCKETS_S = 1.0
"""How often the plugin looks whether its sockets are still there."""


class AllocatedClaims:
    """The MIG enactor's view of a DRA node's holders: claims allocated here, prepared or
    not (:meth:`DraPlugin.holders_allocated`)."""

    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def holders(self) -> Holders:
        return self.plugin.holders_allocated()


class DraPlugin:
    def __init__(self, kube: Kube, opts: Options,
                 gpus: Callable[[], Sequence[GPUInventory] | None],
                 units: Callable[[], Sequence[Unit]],
                 pods: Callable[[], Iterable[Mapping[str, Any]]] = lambda: (),
                 on_claims: Callable[[], None] = lambda: None) -> None:
        """``gpus``: the node's GPUs with the units they offer, as the daemon publishes them
        (None: not known yet); ``units``: the units' device numbers (``sim`` visibility);
        ``pods``: the pods bound to the node, as a watch has them (who uses which claim);
        ``on_claims``: told (any thread) once the prepared claims are read and whenever one
        is unprepared or resized (what the node publishes follows them)."""
        self.kube = kube
        self.opts = opts
        self.node = NodeView(gpus, units)
        self.units = units
        self.pods = pods
        self.server: DraServer | None = None
        self.checkpoint: Checkpoint | None = None
        """The claims prepared here, read first when the plugin starts."""
        self.writer: BudgetWriter | None = None
        self.preparer: ClaimPreparer | None = None
        self.on_claims = on_claims
        self.maker: Maker | None = None
        """Makes the MIG instances of claims on GPUs in migMode OnDemand (set once the MIG
        enactor exists; None: a claim for one fails)."""
        self.on_demand: OnDemandGPUs = lambda: {}
        self.error: str | None = "not started yet"
        self._loop: asyncio.AbstractEventLoop | None = None

    def not_ready(self) -> list[str]:
        if self.error is not None:
            return [f"DRA plugin: {self.error}"]
        return self.server.not_ready() if self.server is not None else []

    def holders(self) -> Holders:
        """The units of every claim prepared here (unprepared: gone), for the MIG enactor: a
        claim's pod holds its units from the moment prepare began until unprepare, whether or
        not a process runs on them. Raises OSError before the prepared claims are read (every
        unit then counts as held: fail closed)."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise OSError("the DRA plugin has not read its prepared claims yet"
                          + (f" ({self.error})" if self.error else ""))
        out: dict[str, list[str]] = {}
        for c in checkpoint.claims():
            for u in c.units:
                out.setdefault(u.uuid, []).append(f"{c.namespace}/{c.name} (ResourceClaim)")
        return out

    def holders_allocated(self, claims: Sequence[Mapping[str, Any]] | None = None) -> Holders:
        """What a MIG change waits for: the prepared claims' units (:meth:`holders`) and the
        units of every claim the scheduler allocated on this node's pool and the kubelet
        has not prepared yet (its pod is starting). Read from a list of the cluster's
        ResourceClaims (``claims``, when the caller listed them already), made only when the
        MIG enactor asks (after it withdrew the devices from the node's slices, so no new
        claim is allocated them); raises OSError when the list cannot be made (the change
        waits: fail closed)."""
        out = {u: list(h) for u, h in self.holders().items()}
        gpus = self.node.gpus() or ()
        listed = self._claims() if claims is None else claims
        for unit, who in allocated_units(listed, self.opts.node_name, gpus).items():
            out.setdefault(unit, []).extend(w for w in who if w not in out[unit])
        return out

    def _claims(self) -> list[dict[str, Any]]:
        """The cluster's ResourceClaims (OSError when they cannot be listed)."""
        url = path("resource.k8s.io", "v1", "resourceclaims")
        body = self._ask("listing ResourceClaims", lambda: self.kube.list(url))
        return list(body.get("items") or [])

    def units_held(self) -> frozenset[str] | None:
        """The units the prepared claims hold (None before they are read: every unit then
        counts as held)."""
        try:
            return frozenset(self.holders())
        except OSError:
            return None

    def keeps_instance(self, inst: MadeInstance, have: MigInstanceState) -> str | None:
        """Why an instance of an on-demand GPU that no prepared claim holds must stay, asked
        right before it is destroyed as unused (:class:`DemandRunner`, under the GPU's
        lock): a claim allocated here names it, by its MIG device or by its placement
        (prepare is making it, or will); or the claims cannot be listed (fail closed). None:
        nothing keeps it."""
        try:
            claims = self._claims()
            held = self.holders_allocated(claims)
        except OSError as exc:
            return f"the claims allocated here cannot be read ({exc})"
        who = list(held.get(have.uuid, [])) if have.uuid else []
        who += allocated_placements(claims, self.opts.node_name, self.on_demand()).get(
            place_of(inst), [])
        return f"allocated to {', '.join(dict.fromkeys(who))}" if who else None

    def containers(self) -> list[SetUpContainer]:
        """The claims prepared here, as the core controllers and the audit read containers
        (:mod:`tessera_node.dra.containers`); none before the plugin read its checkpoint."""
        checkpoint, writer = self.checkpoint, self.writer
        if checkpoint is None or writer is None:
            return []
        gpu_of = {u.uuid: u.gpu_uuid for u in self.units()}
        return claim_containers(checkpoint.claims(), users_by_claim(self.pods()), gpu_of,
                                lambda uid: (str(writer.budget_path(uid)),
                                             str(writer.ledger_dir(uid))))

    def made_for(self) -> dict[str, str]:
        """MIG device UUID -> the claim (namespace/name) its instance was made for (migMode
        OnDemand), from the prepared claims."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            return {}
        return {u.uuid: f"{c.namespace}/{c.name}" for c in checkpoint.claims() if c.made
                for u in c.units}

    def unit_indexes(self) -> dict[str, int]:
        """The units the node has now (GPU or MIG UUID) -> their GPU's NVML index."""
        return {u.uuid: u.gpu_index for u in self.units()}

    def read_policy(self, namespace: str) -> ClaimPolicy:
        """The namespace's GPUQuotas' weight and lending, read on the daemon's loop."""
        url = path(GROUP, VERSION, GPUQUOTAS, namespace)
        body = self._ask(f"reading the GPUQuotas of {namespace}", lambda: self.kube.list(url))
        return claim_policy(namespace, body.get("items") or [])

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The ResourceClaim, read on the daemon's loop (called from a gRPC thread)."""
        url = path("resource.k8s.io", "v1", "resourceclaims", namespace, name)
        return self._ask(f"reading ResourceClaim {namespace}/{name}",
                         lambda: self.kube.get(url),
                         missing=f"ResourceClaim {namespace}/{name} does not exist")

    def _ask(self, what: str, call: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
             missing: str | None = None) -> dict[str, Any]:
        """``call()`` run on the daemon's loop, from a worker or gRPC thread: its answer;
        OSError when the API server cannot answer now (the caller fails or waits: nothing
        is guessed); with ``missing``, a 404 is a ClaimError saying so."""
        if self._loop is None:
            raise OSError("the DRA plugin has not started")
        try:
            return asyncio.run_coroutine_threadsafe(call(), self._loop).result(
                CLAIM_READ_TIMEOUT_S)
        except ApiError as exc:
            if missing is not None and exc.status == 404:
                raise ClaimError(missing) from None
            raise OSError(f"{what}: {exc}") from None
        except TimeoutError:
            raise OSError(f"{what}: no answer in {CLAIM_READ_TIMEOUT_S:.0f} s") from None

    def _prepare(self) -> DraServer:
        state = Path(self.opts.state_dir)
        # the prepared claims first: they hold their units even while the rest cannot start
        checkpoint = self.checkpoint or Checkpoint(state / DRA_CHECKPOINT)
        self.checkpoint = checkpoint
        self.on_claims()  # the capacity live resizes hold, before anything is published
        lib_dir = library.install(self.opts.libtessera, state / LIB_DIR)
        sim = None
        if self.opts.device_visibility == "sim":
            sim = SimPaths.of(str(Path(self.opts.driver_root) / "lib"), self.opts.sim_node)
        config = DraConfig(node=self.opts.node_name, lib_dir=str(lib_dir),
                           visibility=self.opts.device_visibility,  # type: ignore[arg-type]
                           cdi_dir=self.opts.cdi_dir, sim=sim)
        writer = BudgetWriter(state / CLAIMS_DIR, int(self.opts.budget_wait_s * 1000))
        writer.empty_trash()
        self.writer = writer
        preparer = ClaimPreparer(config, writer, checkpoint, self.read_claim, self.node,
                                 self.read_policy, on_change=self.on_claims,
                                 maker=self.maker, on_demand=self.on_demand)
        self.preparer = preparer
        server = DraServer(preparer, self.opts.kubelet_root)
        server.start()
        log.info("DRA plugin prepared", extra={"libtessera": str(lib_dir),
                                               "claims": len(checkpoint.claims()),
                                               "visibility": config.visibility})
        return server

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            if self.server is None:
                try:
                    self.server = await asyncio.to_thread(self._prepare)
                except (OSError, ValueError) as exc:
                    self.error = str(exc)
                    raise
            self.error = None
            while True:
                await asyncio.sleep(CHECK_SOCKETS_S)
                await asyncio.to_thread(self.server.serve_again_if_gone)
        finally:
            if self.server is not None:
                await asyncio.to_thread(self.server.stop)
                self.server = None
