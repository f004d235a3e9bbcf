"""A ResourceClaim's allocation on this node becomes one budget entry per unit: the capacity
the scheduler recorded for a shared device, the whole unit where consumable capacity is off,
no limit for a whole MIG instance; anything tessera cannot honour fails the claim with a
reason a user can act on."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG, DRA_DRIVER, MIG_PREFIX, VGPU
from tessera_node.budget.formats import BudgetEntry
from tessera_node.container.entries import INITIAL_RATE
from tessera_node.dra.claims import (
    ClaimError,
    Result,
    UnitBudget,
    allocated_placements,
    allocated_units,
    allocation,
    entries,
    node_units,
)

NODE = "node-a"
MIB = 1 << 20
GIB = 1 << 30
H100_MIB = 81559
G0 = "GPU-00000000-1111-2222-3333-444444444444"
G1 = "GPU-00000001-1111-2222-3333-444444444444"
M10 = "MIG-00010000-1111-2222-3333-444444444444"
M14 = "MIG-00010004-1111-2222-3333-444444444444"


def gpus(unhealthy: frozenset[str] = frozenset()) -> list[GPUInventory]:
    """gpu0: a shared H100; gpu1 in MIG: a whole 1g.10gb at 0, a shared 3g.40gb at 4."""
    return [
        GPUInventory(index=0, uuid=G0, model="H100-80GB", memoryMiB=H100_MIB, units=(
            AdvertisedUnit(uuid=G0, resource=VGPU, memoryMiB=H100_MIB, shares=10,
                           healthy=G0 not in unhealthy),)),
        GPUInventory(index=1, uuid=G1, model="H100-80GB", memoryMiB=H100_MIB,
                     migMode="enabled", units=(
            AdvertisedUnit(uuid=M10, resource=MIG_PREFIX + "1g.10gb", memoryMiB=9984,
                           profile="1g.10gb", start=0),
            AdvertisedUnit(uuid=M14, resource=VGPU, memoryMiB=40192, shares=10,
                           profile="3g.40gb", start=4))),
    ]


def result(device: str, request: str = "gpu", pool: str = NODE,
           consumed: dict[str, str] | None = None, share: str | None = None,
           driver: str = DRA_DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed is not None:
        r["consumedCapacity"] = consumed
    if share:
        r["shareID"] = share
    return r


def claim(*results: dict[str, Any], cls: str = DRA_DEVICE_CLASS) -> dict[str, Any]:
    """A claim whose requests (one per result's request name) ask through ``cls``."""
    names = sorted({str(r["request"]) for r in results})
    return {"metadata": {"namespace": "team", "name": "c", "uid": "u1"},
            "spec": {"devices": {"requests": [
                {"name": n, "exactly": {"deviceClassName": cls}} for n in names]}},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def test_device_names_map_back_to_the_units() -> None:
    assert {n: u.uuid for n, u in node_units(gpus()).items()} == {
        "gpu0": G0, "gpu1-mig0-1g10gb": M10, "gpu1-mig4-3g40gb": M14}


CASES = [
    ("shared GPU: the consumed capacity",
     [result("gpu0", consumed={"memory": "4Gi", "cores": "30"}, share="s1")],
     [UnitBudget(G0, 4 * GIB, 30)]),
    ("shared GPU with all its cores: a memory limit only",
     [result("gpu0", consumed={"memory": "1Gi", "cores": "100"})],
     [UnitBudget(G0, GIB, 100)]),
    ("shared GPU, consumable capacity off (1.34): the whole unit",
     [result("gpu0")],
     [UnitBudget(G0, H100_MIB * MIB, None)]),
    ("whole MIG instance: no limit",
     [result("gpu1-mig0-1g10gb")],
     [UnitBudget(M10, None, None)]),
    ("shared MIG instance",
     [result("gpu1-mig4-3g40gb", consumed={"memory": "10240Mi", "cores": "50"})],
     [UnitBudget(M14, 10 * GIB, 50)]),
    ("two devices, in the claim's order",
     [result("gpu1-mig0-1g10gb", "a"), result("gpu0", "b", consumed={"memory": "2Gi",
                                                                       "cores": "10"})],
     [UnitBudget(M10, None, None), UnitBudget(G0, 2 * GIB, 10)]),
    ("one device twice: the sum on one entry",
     [result("gpu0", "a", consumed={"memory": "1Gi", "cores": "20"}, share="s1"),
      result("gpu0", "b", consumed={"memory": "3Gi", "cores": "30"}, share="s2")],
     [UnitBudget(G0, 4 * GIB, 50)]),
    ("another driver's results are not tessera's",
     [result("gpu0", consumed={"memory": "1Gi", "cores": "5"}),
      result("nic0", driver="nic.example.com")],
     [UnitBudget(G0, GIB, 5)]),
]


@pytest.mark.parametrize(("results", "want"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_allocation_results_become_unit_budgets(results: list[dict[str, Any]],
                                                want: list[UnitBudget]) -> None:
    got = allocation(claim(*results), NODE, gpus())
    assert list(got.units) == want
    assert [(r.request, r.pool, r.device) for r in got.results] == [
        (r["request"], r["pool"], r["device"]) for r in results
        if r["driver"] == DRA_DRIVER]


REFUSED = [
    ("not allocated", {"metadata": {"namespace": "team", "name": "c"}, "status": {}},
     "is not allocated"),
    ("nothing of tessera's", claim(result("nic0", driver="nic.example.com")),
     f"has no device of {DRA_DRIVER}"),
    ("another node's pool", claim(result("gpu0", pool="node-b")),
     "allocated for another node"),
    ("a device the node does not have", claim(result("gpu7")),
     "has no device gpu7"),
    ("consumed memory missing", claim(result("gpu0", consumed={"cores": "10"})),
     "records no consumed memory"),
    ("consumed cores missing", claim(result("gpu0", consumed={"memory": "1Gi"})),
     "records no consumed cores"),
    ("consumed memory unreadable", claim(result("gpu0", consumed={"memory": "lots",
                                                                  "cores": "10"})),
     "not readable"),
    ("more memory than the unit has", claim(result("gpu0", consumed={"memory": "100Gi",
                                                                     "cores": "10"})),
     "outside 1.."),
    ("cores over 100", claim(result("gpu0", consumed={"memory": "1Gi", "cores": "101"})),
     "cores 101 is outside"),
    ("fractional cores", claim(result("gpu0", consumed={"memory": "1Gi", "cores": "500m"})),
     "not a whole percent"),
    ("admin access", claim({**result("gpu0"), "adminAccess": True}), "no admin access"),
    ("asked through a DeviceClass no GPUQuota counts",
     claim(result("gpu0", consumed={"memory": "1Gi", "cores": "10"}), cls="any-gpu.example"),
     "request gpu asks through DeviceClass 'any-gpu.example'; gpu.tessera.dev prepares its "
     "devices only for requests through gpu.tessera.dev or mig.gpu.tessera.dev"),
    ("a result naming no request of the claim",
     claim(result("gpu0", request="other", consumed={"memory": "1Gi", "cores": "10"}),
           cls="x") | {"spec": {"devices": {"requests": []}}},
     "request other asks through DeviceClass None"),
]


STATED = [
    ("memory and cores", {"memory": "2Gi", "cores": "25"}, UnitBudget(M10, 2 * GIB, 25)),
    ("memory only: no core limit", {"memory": "4Gi"}, UnitBudget(M10, 4 * GIB, None)),
    ("more than the instance has: the instance", {"memory": "40Gi", "cores": "100"},
     UnitBudget(M10, 9984 * MIB, 100)),
]


@pytest.mark.parametrize(("stated", "want"), [c[1:] for c in STATED], ids=[c[0] for c in STATED])
def test_a_whole_instance_whose_request_states_capacity_is_held_to_it(
        stated: dict[str, str], want: UnitBudget) -> None:
    """Under a GPUQuota every request states capacity (what the quota counted): a whole
    instance was given whole before, so a claim counted for 2 GiB used all 10 GB."""
    obj = claim(result("gpu1-mig0-1g10gb"), cls=DRA_DEVICE_CLASS_MIG)
    obj["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": stated}
    assert allocation(obj, NODE, gpus()).units == (want,)


def test_a_first_available_alternative_asks_through_its_own_class() -> None:
    obj = claim(result("gpu1-mig0-1g10gb", request="one/mig"))
    obj["spec"]["devices"]["requests"] = [{"name": "one", "firstAvailable": [
        {"name": "shared", "deviceClassName": "other.example"},
        {"name": "mig", "deviceClassName": DRA_DEVICE_CLASS_MIG}]}]
    assert allocation(obj, NODE, gpus()).units == (UnitBudget(M10, None, None),)
    obj["spec"]["devices"]["requests"][0]["firstAvailable"][1]["deviceClassName"] = "x"
    with pytest.raises(ClaimError, match="asks through DeviceClass 'x'"):
        allocation(obj, NODE, gpus())


@pytest.mark.parametrize(("obj", "reason"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_a_claim_tessera_cannot_honour_fails_with_a_reason(obj: dict[str, Any],
                                                           reason: str) -> None:
    with pytest.raises(ClaimError, match=reason):
        allocation(obj, NODE, gpus())


def test_an_unhealthy_unit_fails_the_claim() -> None:
    with pytest.raises(ClaimError, match="unhealthy"):
        allocation(claim(result("gpu0")), NODE, gpus(unhealthy=frozenset({G0})))


def test_entries_budget_each_unit_in_order() -> None:
    got = entries([UnitBudget(M10, None, None), UnitBudget(G0, 4 * GIB, 30),
                   UnitBudget(M14, GIB, None), UnitBudget(G1, GIB, 100)])
    assert got == [
        BudgetEntry(index=0, uuid=M10),
        BudgetEntry(index=1, uuid=G0, memory=4 * GIB, cores=30, rate=INITIAL_RATE,
                    burst=INITIAL_RATE / 20),
        BudgetEntry(index=2, uuid=M14, memory=GIB),
        BudgetEntry(index=3, uuid=G1, memory=GIB),
    ]


@given(st.lists(st.tuples(st.integers(1, 1 << 16), st.integers(1, 100)), min_size=1,
                max_size=4))
def test_consumed_capacity_is_the_budget_exactly(shares: list[tuple[int, int]]) -> None:
    """Whatever the scheduler recorded (MiB steps, whole percents), the budget is that much;
    several shares of one device in one claim add up, cores capped at the unit's 100; a total
    past the unit's memory fails the claim rather than being cut down."""
    results = [result("gpu0", f"r{i}", consumed={"memory": f"{m}Mi", "cores": str(c)},
                      share=f"s{i}") for i, (m, c) in enumerate(shares)]
    memory = sum(m for m, _ in shares) * MIB
    cores = min(100, sum(c for _, c in shares))
    if memory > H100_MIB * MIB:
        with pytest.raises(ClaimError):
            allocation(claim(*results), NODE, gpus())
        return
    got = allocation(claim(*results), NODE, gpus())
    assert got.units == (UnitBudget(G0, memory, cores),)
    assert got.results == tuple(Result(f"r{i}", NODE, "gpu0", f"s{i}")
                                for i in range(len(shares)))
    (entry,) = entries(got.units)
    assert entry.uuid == G0 and entry.memory == memory
    assert entry.cores == (cores if cores < 100 else None)


def test_claims_allocated_on_this_node_hold_their_units_prepared_or_not() -> None:
    """What a MIG change waits for: every claim with a device of this node's pool, whoever
    prepared it; another node's pool, another driver and unallocated claims hold nothing, a
    device the node no longer has holds nothing, and a claim is named once per unit."""
    a = claim(result("gpu1-mig0-1g10gb"), result("gpu0", request="b", share="s1"))
    twice = claim(result("gpu0", request="x", share="s2"), result("gpu0", request="y",
                                                                  share="s3"))
    twice["metadata"]["name"] = "twice"
    other_node = claim(result("gpu1-mig0-1g10gb", pool="node-b"))
    other_node["metadata"]["name"] = "elsewhere"
    other_driver = claim(result("gpu1-mig4-3g40gb", driver="gpu.nvidia.com"))
    gone = claim(result("gpu7"))
    pending = {"metadata": {"namespace": "team", "name": "pending"}, "status": {}}
    got = allocated_units([a, twice, other_node, other_driver, gone, pending], NODE, gpus())
    assert got == {M10: ["team/c (ResourceClaim)"],
                   G0: ["team/c (ResourceClaim)", "team/twice (ResourceClaim)"]}


def test_claims_allocated_a_placement_of_an_on_demand_gpu_keep_its_instance() -> None:
    """What keeps an instance no prepared claim holds: a claim allocated its placement on this
    node's pool (prepare makes it, or will). Another node's pool, another driver, a GPU not
    on demand, a name that is no placement and an unallocated claim keep nothing."""
    on_demand = {1: (G1, "H100-80GB")}
    a = claim(result("gpu1-mig4-3g40gb"), result("gpu0", request="b", share="s1"))
    b = claim(result("gpu1-mig4-3g40gb", request="x"), result("gpu1-mig0-1g10gb",
                                                                request="y"))
    b["metadata"]["name"] = "b"
    other_node = claim(result("gpu1-mig6-1g10gb", pool="node-b"))
    other_driver = claim(result("gpu1-mig5-1g10gb", driver="gpu.nvidia.com"))
    not_on_demand = claim(result("gpu0-mig0-1g10gb"))
    bad_start = claim(result("gpu1-mig5-3g40gb"))
    pending = {"metadata": {"namespace": "team", "name": "pending"}, "status": {}}
    got = allocated_placements([a, b, other_node, other_driver, not_on_demand, bad_start,
                                pending], NODE, on_demand)
    assert got == {(G1, "3g.40gb", 4): ["team/c (ResourceClaim)", "team/b (ResourceClaim)"],
                   (G1, "1g.10gb", 0): ["team/b (ResourceClaim)"]}
