"""Builders and hypothesis strategies shared by the placement tests."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from tessera.api.names import VGPU
from tessera.api.resources import mig_resource_name
from tessera.mig.catalog import profile
from tessera.mig.planner import feasible_layouts, fit
from tessera.placement.choose import Fit, place
from tessera.placement.demand import Demand
from tessera.placement.policy import DEFAULT, Policy
from tessera.placement.record import PlacementRecord
from tessera.placement.units import Unit
from tessera.placement.usage import Placed, UnitUsage, usage

NODE = "node-0"


def gpu_unit(uuid: str, memory: int = 9984, shares: int = 10, *, gpu: str | None = None,
             index: int = 0, model: str = "H100-80GB", numa: int | None = 0,
             peers: Sequence[str] = (), healthy: bool = True, resource: str = VGPU,
             prof: str | None = None, start: int | None = None) -> Unit:
    return Unit(node=NODE, uuid=uuid, gpu_uuid=gpu or uuid, gpu_index=index, model=model,
                resource=resource, memory_mib=memory, shares=shares if resource == VGPU else 0,
                healthy=healthy, profile=prof, start=start, numa_node=numa,
                nvlink_peers=frozenset(peers))


def mig_unit(gpu: str, prof: str, start: int, *, model: str = "H100-80GB", whole: bool = True,
             shares: int = 4, index: int = 0, numa: int | None = 0,
             peers: Sequence[str] = ()) -> Unit:
    p = profile(model, prof)
    return gpu_unit(f"MIG-{gpu[4:]}-{prof}@{start}", p.memory_mib, shares, gpu=gpu,
                    index=index, model=model, numa=numa, peers=peers,
                    resource=mig_resource_name(prof) if whole else VGPU, prof=prof,
                    start=start)


def vgpu(container: str = "main", count: int = 1, memory: int = 0, cores: float = 0, *,
         init: bool = False, sidecar: bool = False) -> Demand:
    return Demand(container=container, init=init, sidecar=sidecar, resource=VGPU, count=count,
                  memory_mib=memory, cores=cores)


def mig(prof: str, container: str = "main", count: int = 1, *, init: bool = False) -> Demand:
    return Demand(container=container, init=init, resource=mig_resource_name(prof),
                  count=count, memory_mib=0, cores=0.0)


def placed_pod(key: str, record: PlacementRecord, demands: Sequence[Demand],
               priority: int = 0) -> Placed:
    return Placed(key=key, uid=f"uid-{key}", priority=priority, node=record.node,
                  record=record, demands=tuple(demands))


def fill(units: Sequence[Unit], pods: Sequence[Sequence[Demand]], policy: Policy = DEFAULT,
         priorities: Sequence[int] | None = None) -> list[Placed]:
    """Place ``pods`` one after another, usage updated; the ones that fit."""
    out: list[Placed] = []
    for n, demands in enumerate(pods):
        got = place(NODE, demands, units, usage(units, out), policy)
        if isinstance(got, Fit):
            prio = priorities[n] if priorities else 0
            out.append(placed_pod(f"ns/pod-{n:02d}", got.record, demands, prio))
    return out


def within_capacity(units: Sequence[Unit], used: dict[str, UnitUsage]) -> list[str]:
    """Every way ``used`` exceeds a unit (empty: none)."""
    bad = []
    for u in units:
        x = used[u.uuid]
        if u.shared:
            if x.memory_mib > u.memory_mib or x.cores > 100 + 1e-9 or x.shares > u.shares:
                bad.append(f"{u.uuid}: {x}")
        elif x.shares > 1 or len(x.holders) > 1:
            bad.append(f"{u.uuid}: {x}")
    return bad


# -- strategies --------------------------------------------------------------------------------

MODELS = ("H100-80GB", "A30-24GB", "A100-40GB")


@st.composite
def mig_gpu(draw: st.DrawFn, index: int, whole_share: float | None = None) -> list[Unit]:
    """One MIG GPU with a catalog-valid layout, each instance whole or shared."""
    model = draw(st.sampled_from(MODELS))
    layout = draw(st.sampled_from(feasible_layouts(model)))
    gpu = f"GPU-{index}"
    out = []
    for pl in fit(model, layout):
        whole = draw(st.booleans()) if whole_share is None else whole_share > 0
        out.append(mig_unit(gpu, pl.profile, pl.start, model=model, whole=whole,
                            shares=draw(st.integers(1, 3)), index=index))
    return out


@st.composite
def node(draw: st.DrawFn, max_gpus: int = 4, mig_ok: bool = True) -> list[Unit]:
    n = draw(st.integers(1, max_gpus))
    units: list[Unit] = []
    gpus = [f"GPU-{i}" for i in range(n)]
    for i, g in enumerate(gpus):
        numa = draw(st.sampled_from([0, 1, None]))
        peers = draw(st.lists(st.sampled_from(gpus), max_size=n, unique=True))
        if mig_ok and draw(st.booleans()):
            units += [replace(u, numa_node=numa, nvlink_peers=frozenset(peers))
                      for u in draw(mig_gpu(i))]
        else:
            units.append(gpu_unit(g, draw(st.sampled_from([6000, 9984, 16000])),
                                  draw(st.integers(1, 4)), index=i, numa=numa, peers=peers,
                                  healthy=draw(st.booleans()) or draw(st.booleans())))
    return units


@st.composite
def pod(draw: st.DrawFn, mig_profiles: Sequence[str] = ("1g.10gb", "3g.40gb", "1g.6gb")
        ) -> list[Demand]:
    """1 to 3 containers (maybe an init container), vgpu or whole MIG."""
    out = []
    for c in range(draw(st.integers(1, 3))):
        init = c == 0 and draw(st.booleans())
        name = f"c{c}"
        if draw(st.integers(0, 3)) == 0:
            out.append(mig(draw(st.sampled_from(mig_profiles)), name, draw(st.integers(1, 2)),
                           init=init))
        else:
            out.append(vgpu(name, draw(st.integers(1, 2)),
                            draw(st.sampled_from([0, 1000, 3000, 6000, 9000])),
                            draw(st.sampled_from([0, 10, 25, 50, 100])), init=init))
    return out
