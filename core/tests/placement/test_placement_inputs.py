"""node_units, pod_demands and usage: reading a node and a pod, counting what is placed."""

from __future__ import annotations

import pytest
from placement_fixtures import gpu_unit, placed_pod, vgpu

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.inventory import (
    AdvertisedUnit,
    GPUInventory,
    NodeInventory,
    from_node,
    to_annotation,
)
from tessera.api.names import ANNOTATION_BUDGET, ANNOTATION_GPUS, VGPU
from tessera.placement.demand import Demand, DemandError, pod_demands
from tessera.placement.record import PlacementRecord
from tessera.placement.units import NoUnitsError, Unit, node_units
from tessera.placement.usage import UnitUsage, usage

# -- node_units ----------------------------------------------------------------------------------

GPU = GPUInventory(
    index=0, uuid="GPU-0", model="H100-80GB", memoryMiB=81559, migMode="enabled",
    numaNode=1, nvlinkPeers=("GPU-1",),
    units=(AdvertisedUnit(uuid="MIG-a", resource=VGPU, memoryMiB=40192, shares=4,
                          profile="3g.40gb", start=0),
           AdvertisedUnit(uuid="MIG-b", resource="tessera.dev/mig-3g.40gb", memoryMiB=40192,
                          healthy=False, profile="3g.40gb", start=4)))


def node(gpus: tuple[GPUInventory, ...]) -> NodeInventory:
    return from_node({"metadata": {"name": "n1", "annotations": {
        ANNOTATION_GPUS: to_annotation(gpus)}}})


def test_node_units_carry_their_gpu() -> None:
    units = node_units(node((GPU,)))
    assert units == [
        Unit("n1", "MIG-a", "GPU-0", 0, "H100-80GB", VGPU, 40192, 4, True, "3g.40gb", 0, 1,
             frozenset({"GPU-1"})),
        Unit("n1", "MIG-b", "GPU-0", 0, "H100-80GB", "tessera.dev/mig-3g.40gb", 40192, 0,
             False, "3g.40gb", 4, 1, frozenset({"GPU-1"}))]
    assert units[0].capacity_shares == 4 and units[1].capacity_shares == 1


def test_node_units_refused() -> None:
    with pytest.raises(NoUnitsError, match="tessera-node on n1 does not publish its units "
                                           r"\(older than placement\)"):
        node_units(node((GPU.model_copy(update={"units": None}),)))
    with pytest.raises(NoUnitsError, match=r"inventory unreadable: node has no tessera\.dev/gpus"):
        node_units(from_node({"metadata": {"name": "n1"}}))
    twice = GPU.model_copy(update={"index": 1, "uuid": "GPU-1"})
    with pytest.raises(NoUnitsError, match="advertises unit MIG-a twice"):
        node_units(node((GPU, twice)))


# -- pod_demands ---------------------------------------------------------------------------------

def pod(containers: list, init: list | None = None, budget: BudgetAnnotation | None = None
        ) -> dict:
    annotations = {ANNOTATION_BUDGET: budget.to_annotation()} if budget else {}
    return {"metadata": {"annotations": annotations},
            "spec": {"containers": containers, "initContainers": init or []}}


def c(name: str, limits: dict | None = None, requests: dict | None = None, **extra: str) -> dict:
    return {"name": name, "resources": {"limits": limits or {}, "requests": requests or {}},
            **extra}


def test_demands_from_totals_and_in_declaration_order() -> None:
    got = pod_demands(pod(
        [c("main", {VGPU: "2", "tessera.dev/vgpu-memory": "12000", "tessera.dev/vgpu-cores": 50}),
         c("cpu", {"cpu": "1"})],
        init=[c("proxy", requests={VGPU: 1}, restartPolicy="Always"),
              c("setup", {"tessera.dev/mig-1g.10gb.me": "1"})]))
    assert got == [
        Demand("proxy", False, VGPU, 1, 0, 0.0, sidecar=True),
        Demand("setup", True, "tessera.dev/mig-1g.10gb.me", 1, 0, 0.0),
        Demand("main", False, VGPU, 2, 6000, 25.0)]


def test_demands_from_the_budget_annotation() -> None:
    budget = BudgetAnnotation(containers={"main": PerShareBudget(
        shares=2, memory_bytes=5000 << 20, cores=30)})
    got = pod_demands(pod([c("main", {VGPU: "2", "tessera.dev/vgpu-memory": "99999"})],
                          budget=budget))
    assert got == [Demand("main", False, VGPU, 2, 5000, 30.0)]
    assert pod_demands(pod([c("main", {"cpu": "1"})])) == []
    assert pod_demands({}) == []


@pytest.mark.parametrize(("p", "message"), [
    (pod([c("main", {VGPU: "1.5"})]), "container main: tessera.dev/vgpu: '1.5' is not a whole"),
    (pod([c("main", {VGPU: "x"})]), "container main: tessera.dev/vgpu: "),
    (pod([c("main", {"tessera.dev/mig-big": "1"})]), "'tessera.dev/mig-big' names no MIG"),
    ({"metadata": {"annotations": {ANNOTATION_BUDGET: "{"}}, "spec": {}},
     "tessera.dev/budget: budget annotation is not JSON"),
])
def test_demand_refusals(p: dict, message: str) -> None:
    with pytest.raises(DemandError, match=message):
        pod_demands(p)


# -- usage ---------------------------------------------------------------------------------------

def test_usage_takes_the_larger_of_app_containers_and_each_init_container() -> None:
    units = [gpu_unit("GPU-a", 20000), gpu_unit("GPU-b", 20000, index=1)]
    demands = [vgpu("proxy", memory=1000, cores=5, sidecar=True),
               vgpu("setup", memory=9000, cores=10, init=True),
               vgpu("main", memory=3000, cores=20), vgpu("aux", memory=2000, cores=20)]
    record = PlacementRecord("node-0", {
        "proxy": {VGPU: ("GPU-a",)}, "setup": {VGPU: ("GPU-a",)},
        "main": {VGPU: ("GPU-a",)}, "aux": {VGPU: ("GPU-a", "GPU-gone")},
        "ghost": {VGPU: ("GPU-b",)}})
    got = usage(units, [placed_pod("ns/p", record, demands),
                        placed_pod("ns/q", PlacementRecord("node-0", {}), [])])
    assert got == {
        "GPU-a": UnitUsage(memory_mib=10000, cores=45, shares=3, holders=("ns/p",)),
        "GPU-b": UnitUsage(memory_mib=0, cores=0, shares=1, holders=("ns/p",))}
