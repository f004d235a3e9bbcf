"""Live resize of prepared claims, the node's decisions (pure): which claims of a pod change
and to what, what a growth reserves on its device, that a growth is applied only when every
claim allocated on the device still fits, that a restarted daemon publishes nothing before it
knows what resizes hold, and that the checkpoint keeps a resized claim's allocation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.claim_budget import ClaimBudget, ClaimBudgetError, claim_budgets_text
from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import (
    ANNOTATION_CLAIM_BUDGET,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    MIG_PREFIX,
    VGPU,
)
from tessera.api.quantity import to_bytes
from tessera.models import get_model
from tessera_node.budget.formats import BudgetEntry
from tessera_node.container.entries import INITIAL_RATE
from tessera_node.device.state import DeviceSnapshot, GPUState
from tessera_node.dra.checkpoint import Checkpoint, PreparedClaim
from tessera_node.dra.claims import Result, UnitBudget, allocation, entries
from tessera_node.dra.resize import (
    ClaimTarget,
    beside_prepared,
    device_use,
    overcommitted,
    pod_targets,
    reserved,
    resized_entries,
    resized_message,
)
from tessera_node.dra.state import DraDevices

NODE = "node-a"
NS = "team"
MIB = 1 << 20
GIB = 1 << 30
H100_MIB = 81559
G0 = "GPU-00000000-1111-2222-3333-444444444444"
G1 = "GPU-00000001-1111-2222-3333-444444444444"
M10 = "MIG-00010000-1111-2222-3333-444444444444"
M14 = "MIG-00010004-1111-2222-3333-444444444444"
POD_UID = "5d3e9a10-0000-4000-8000-000000000001"
CLAIM = "infer-gpu-x7k2q"
CLAIM_UID = "0b6c77aa-0000-4000-8000-000000000002"
ALLOC = UnitBudget(G0, 4 * GIB, 30)


def gpus() -> list[GPUInventory]:
    """gpu0: a shared H100; gpu1 in MIG: a whole 1g.10gb at 0, a shared 3g.40gb at 4."""
    return [
        GPUInventory(index=0, uuid=G0, model="H100-80GB", memoryMiB=H100_MIB, units=(
            AdvertisedUnit(uuid=G0, resource=VGPU, memoryMiB=H100_MIB, shares=10),)),
        GPUInventory(index=1, uuid=G1, model="H100-80GB", memoryMiB=H100_MIB,
                     migMode="enabled", units=(
            AdvertisedUnit(uuid=M10, resource=MIG_PREFIX + "1g.10gb", memoryMiB=9984,
                           profile="1g.10gb", start=0),
            AdvertisedUnit(uuid=M14, resource=VGPU, memoryMiB=40192, shares=10,
                           profile="3g.40gb", start=4))),
    ]


DEVICE = {G0: "gpu0", M10: "gpu1-mig0-1g10gb", M14: "gpu1-mig4-3g40gb"}


def prepared(units: tuple[UnitBudget, ...] = (ALLOC,), uid: str = CLAIM_UID, name: str = CLAIM,
             allocated: tuple[UnitBudget, ...] | None = None,
             namespace: str = NS) -> PreparedClaim:
    """A claim prepared here: ``units`` its budget now, ``allocated`` what its allocation
    gave (None: the same)."""
    return PreparedClaim(uid, namespace, name,
                         tuple(Result("gpu", NODE, DEVICE[u.uuid]) for u in units), units,
                         "team/gpus", 1, True, allocated)


def api_claim(uid: str, *results: dict[str, Any], name: str = "c") -> dict[str, Any]:
    return {"metadata": {"namespace": NS, "name": name, "uid": uid},
            "status": {"allocation": {"devices": {"results": list(results)}}}}


def result(device: str = "gpu0", memory: str | None = "4Gi", cores: str | None = "30",
           pool: str = NODE, driver: str = DRA_DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": pool, "device": device}
    if memory is not None or cores is not None:
        r["consumedCapacity"] = {k: v for k, v in ((DRA_CAPACITY_MEMORY, memory),
                                                   (DRA_CAPACITY_CORES, cores)) if v is not None}
    return r


def pod(budgets: dict[str, ClaimBudget] | None = None,
        generated: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod whose container ``main`` uses its template's claims (``generated``: entry ->
    the claim made for it), with ``tessera.dev/claim-budget`` when ``budgets`` is given."""
    generated = generated if generated is not None else {"gpu": CLAIM}
    ann = {} if budgets is None else {ANNOTATION_CLAIM_BUDGET: claim_budgets_text(budgets)}
    return {"metadata": {"namespace": NS, "name": "infer", "uid": POD_UID, "annotations": ann},
            "spec": {"resourceClaims": [{"name": k, "resourceClaimTemplateName": "t"}
                                        for k in generated],
                     "containers": [{"name": "main", "resources": {
                         "claims": [{"name": k} for k in generated]}}]},
            "status": {"phase": "Running", "resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in generated.items()]}}


def budget(mem_mib: int, cores: int, alloc: tuple[int, int] = (4096, 30)) -> ClaimBudget:
    return ClaimBudget(CLAIM, mem_mib, cores, *alloc)


# -- which claims of a pod change --------------------------------------------------------------


def test_an_approved_growth_targets_the_claim_with_its_new_budget() -> None:
    (t,) = pod_targets(pod({CLAIM_UID: budget(6144, 40)}), [prepared()])
    assert t.claim.uid == CLAIM_UID
    assert t.units == (UnitBudget(G0, 6 * GIB, 40),)
    assert t.grows


@pytest.mark.parametrize(("mem", "cores", "grows"), [
    (2048, 20, False),  # both shrink
    (2048, 40, True),  # fewer bytes, more cores: still takes more of the device
    (6144, 10, True),
    (4096, 10, False),
])
def test_a_change_grows_when_it_takes_more_of_any_resource(mem: int, cores: int,
                                                           grows: bool) -> None:
    (t,) = pod_targets(pod({CLAIM_UID: budget(mem, cores)}), [prepared()])
    assert t.units == (UnitBudget(G0, mem * MIB, cores),)
    assert t.grows is grows


def test_a_claim_the_annotation_no_longer_lists_goes_back_to_its_allocation() -> None:
    """A growth taken back, or a refused resize rolled back, by the operator."""
    grown = prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,))
    for p in (pod({}), pod(None)):
        (t,) = pod_targets(p, [grown])
        assert t.units == (ALLOC,) and not t.grows


def test_a_claim_already_at_its_budget_is_no_target() -> None:
    assert pod_targets(pod({CLAIM_UID: budget(6144, 40)}), [
        prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,))]) == []
    assert pod_targets(pod({}), [prepared()]) == []


def test_a_prepared_claim_the_pod_does_not_use_is_left_alone() -> None:
    """Even when the annotation names its UID: the pod's annotation decides its own claims
    only."""
    theirs = prepared(uid="other-uid", name="someone-elses")
    p = pod({CLAIM_UID: budget(6144, 40), "other-uid": budget(8192, 50)})
    (t,) = pod_targets(p, [theirs, prepared()])
    assert t.claim.uid == CLAIM_UID
    assert pod_targets(p, [theirs]) == []
    # the same name in another namespace is another claim
    assert pod_targets(p, [prepared(namespace="elsewhere")]) == []


@pytest.mark.parametrize(("claim", "budgets", "why"), [
    (prepared(), {CLAIM_UID: budget(6144, 40, alloc=(2048, 30))},
     f"claim {CLAIM}: its allocation here is 4096 MiB and 30% cores, not the 2048 MiB and "
     "30% the resize was approved on"),
    (prepared(), {CLAIM_UID: budget(6144, 40, alloc=(4096, 20))}, "not the 4096 MiB and 20%"),
    (prepared((UnitBudget(G0, H100_MIB * MIB, None),)), {CLAIM_UID: budget(6144, 40)},
     "prepared here as 1 device.s. without a budget of one share to resize"),
    (prepared((UnitBudget(M10, None, None),)), {CLAIM_UID: budget(6144, 40)},
     "without a budget of one share"),
    (prepared((ALLOC, UnitBudget(M14, 2 * GIB, 10))), {CLAIM_UID: budget(6144, 40)},
     "prepared here as 2 device.s."),
])
def test_a_budget_that_does_not_fit_the_claim_as_prepared_is_refused(
        claim: PreparedClaim, budgets: dict[str, ClaimBudget], why: str) -> None:
    with pytest.raises(ClaimBudgetError, match=why):
        pod_targets(pod(budgets), [claim])


def test_an_unreadable_annotation_is_refused() -> None:
    p = pod()
    p["metadata"]["annotations"][ANNOTATION_CLAIM_BUDGET] = '{"u": {"claim": "c"}}'
    with pytest.raises(ClaimBudgetError, match="memoryMiB"):
        pod_targets(p, [prepared()])


@pytest.mark.parametrize(("consumed", "alloc_mib"), [("4Gi", 4096), ("1G", 954)])
def test_the_allocation_the_operator_approved_on_is_the_one_prepared_here(
        consumed: str, alloc_mib: int) -> None:
    """The operator reads consumedCapacity in MiB rounded up ("1G": 953.67 MiB); the claim
    as this node prepared it from the same allocation matches that."""
    c = api_claim(CLAIM_UID, result(memory=consumed, cores="30"), name=CLAIM)
    c["spec"] = {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": DRA_DEVICE_CLASS}}]}}
    alloc = allocation(c, NODE, gpus())
    here = PreparedClaim(CLAIM_UID, NS, CLAIM, alloc.results, alloc.units)
    (t,) = pod_targets(pod({CLAIM_UID: budget(6144, 30, alloc=(alloc_mib, 30))}), [here])
    assert t.units == (UnitBudget(G0, 6 * GIB, 30),) and t.grows
    assert reserved([replace(here, units=t.units, allocated=here.units)]) == {
        G0: (6 * GIB - to_bytes(consumed), 0)}


# -- what resizes reserve ----------------------------------------------------------------------


def test_reserved_is_what_budgets_take_beyond_their_allocations_per_device() -> None:
    grown = prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,))
    also = prepared((UnitBudget(G0, 3 * GIB, 25),), uid="u2", name="b",
                    allocated=(UnitBudget(G0, 2 * GIB, 20),))
    shrunk = prepared((UnitBudget(G0, 1 * GIB, 10),), uid="u3", name="c", allocated=(ALLOC,))
    on_mig = prepared((UnitBudget(M14, 5 * GIB, 10),), uid="u4", name="d",
                      allocated=(UnitBudget(M14, 4 * GIB, 10),))
    whole = prepared((UnitBudget(M10, None, None),), uid="u5", name="e")
    got = reserved([grown, also, shrunk, on_mig, whole, prepared(uid="u6", name="f")])
    # a shrunk claim frees nothing: its allocation stays counted by the scheduler
    assert got == {G0: (3 * GIB, 15), M14: (GIB, 0)}
    assert reserved([]) == {}


def test_a_pending_budget_is_reserved_in_place_of_the_current_one() -> None:
    grown = prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,))
    assert reserved([grown], {CLAIM_UID: (UnitBudget(G0, 8 * GIB, 50),)}) == {
        G0: (4 * GIB, 20)}
    assert reserved([grown], {CLAIM_UID: (ALLOC,)}) == {}
    assert reserved([prepared()], {"not-prepared": (UnitBudget(G0, 80 * GIB, 90),)}) == {}


# -- what the device holds ---------------------------------------------------------------------


def test_device_use_counts_every_allocated_claim_and_every_resize() -> None:
    claims = [
        api_claim(CLAIM_UID, result()),  # the claim being resized: its allocation
        api_claim("u2", result(memory="10Gi", cores="20")),  # allocated, not prepared yet
        api_claim("u3", result(memory=None, cores=None)),  # consumable capacity off: all
        api_claim("u4", result("gpu1-mig4-3g40gb", "8Gi", "50")),
        api_claim("u5", result(pool="node-b"), result(driver="nic.example.com")),  # not here
        api_claim("u6", result("gpu7")),  # a device this node does not know
    ]
    use = device_use(claims, NODE, gpus(), [prepared()], {})
    assert use == {G0: (4 * GIB + 10 * GIB + H100_MIB * MIB, 30 + 20 + 100),
                   M14: (8 * GIB, 50)}


def test_an_unreadable_consumed_capacity_counts_the_whole_device() -> None:
    for r in (result(memory="4Gi", cores=None), result(memory="lots", cores="30")):
        assert device_use([api_claim("u", r)], NODE, gpus(), [], {}) == {
            G0: (H100_MIB * MIB, 100)}


def test_a_prepared_claim_the_list_no_longer_shows_counts_its_allocation_and_growth() -> None:
    """Deleted while its pod runs: the pod still uses what was prepared."""
    grown = prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,))
    assert device_use([], NODE, gpus(), [grown], {}) == {G0: (6 * GIB, 40)}
    # listed: its consumedCapacity stands for the allocation, not counted twice
    assert device_use([api_claim(CLAIM_UID, result())], NODE, gpus(), [grown], {}) == {
        G0: (6 * GIB, 40)}
    # a whole MIG instance prepared here and gone from the list: all of it
    whole = prepared((UnitBudget(M10, None, None),), uid="u5", name="e")
    (mem, cores), = device_use([], NODE, gpus(), [whole], {}).values()
    assert mem >= 9984 * MIB and cores == 100


def test_device_use_counts_the_pending_growth_in_place_of_the_current_budget() -> None:
    claims = [api_claim(CLAIM_UID, result())]
    pending = {CLAIM_UID: (UnitBudget(G0, 10 * GIB, 70),)}
    assert device_use(claims, NODE, gpus(), [prepared()], pending) == {G0: (10 * GIB, 70)}


# -- does it fit -------------------------------------------------------------------------------


def test_overcommitted_says_which_device_and_by_how_much() -> None:
    g = gpus()
    assert overcommitted(g, {G0: (H100_MIB * MIB, 100)}, [G0]) is None  # exactly full
    assert overcommitted(g, {}, [G0, M14]) is None
    why = overcommitted(g, {G0: (H100_MIB * MIB + 1, 10)}, [G0])
    assert why is not None and f"would take {H100_MIB} MiB of its {H100_MIB} MiB" in why
    why = overcommitted(g, {G0: (GIB, 101)}, [G0])
    assert why is not None and "would take 101% of its cores" in why
    why = overcommitted(g, {M14: (41 * GIB, 10)}, [G0, M14])
    assert why is not None and M14 in why and "of its 40192 MiB" in why
    assert overcommitted(g, {M10: (0, 0)}, [M10]) == (
        f"{M10} is a whole device here: it has no share to grow into")
    assert overcommitted(g, {}, ["GPU-gone"]) == "device GPU-gone is not on this node any more"


def test_a_claim_being_prepared_must_fit_beside_the_prepared_budgets() -> None:
    g = gpus()
    grown = prepared((UnitBudget(G0, 60 * GIB, 40),), allocated=(ALLOC,))
    assert beside_prepared(g, [UnitBudget(G0, 10 * GIB, 10)], [grown]) is None
    why = beside_prepared(g, [UnitBudget(G0, 20 * GIB, 10)], [grown])
    assert why == (f"device {G0} has 61440 MiB of its {H100_MIB} MiB held by the claims "
                   f"prepared on it (live resizes included): 20480 MiB more does not fit")
    # a whole instance prepared here holds all of it
    whole = prepared((UnitBudget(M14, None, None),), uid="u2", name="b")
    assert beside_prepared(g, [UnitBudget(M14, MIB, 10)], [whole]) is not None
    # a claim with no memory limit (a whole instance) is not this check's
    assert beside_prepared(g, [UnitBudget(M10, None, None)], [grown]) is None
    assert beside_prepared(g, [UnitBudget(G0, H100_MIB * MIB, 100)], []) is None


@settings(max_examples=300, deadline=None)
@given(
    claims=st.lists(st.tuples(st.integers(1, 30000), st.integers(1, 60),  # allocation
                              st.integers(1, 40000), st.integers(1, 100),  # budget now
                              st.booleans()),  # still listed by the API server
                    max_size=5),
    unprepared=st.lists(st.tuples(st.integers(1, 30000), st.integers(1, 60)), max_size=2),
    growth=st.tuples(st.integers(0, 5), st.integers(1, 60000), st.integers(1, 100)),
)
def test_a_growth_judged_to_fit_never_overcommits_the_device(
        claims: list[tuple[int, int, int, int, bool]], unprepared: list[tuple[int, int]],
        growth: tuple[int, int, int]) -> None:
    """Whatever the claims on a device (prepared and resized, prepared and deleted from the
    API server, allocated and not prepared yet) and whichever claim grows: it fits exactly
    when the allocations plus what every budget takes beyond its allocation fit the device."""
    g = gpus()
    done, listed = [], []
    for i, (am, ac, bm, bc, is_listed) in enumerate(claims):
        alloc, now = UnitBudget(G0, am * MIB, ac), UnitBudget(G0, bm * MIB, bc)
        done.append(prepared((now,), uid=f"u{i}", name=f"c{i}",
                             allocated=None if now == alloc else (alloc,)))
        if is_listed:
            listed.append(api_claim(f"u{i}", result(memory=f"{am}Mi", cores=str(ac))))
    for j, (am, ac) in enumerate(unprepared):
        listed.append(api_claim(f"n{j}", result(memory=f"{am}Mi", cores=str(ac))))
    listed.append(api_claim("mig", result("gpu1-mig4-3g40gb", "40192Mi", "100")))  # elsewhere
    which, gm, gc = growth
    pending = ({f"u{which}": (UnitBudget(G0, gm * MIB, gc),)} if which < len(claims) else {})

    fits = overcommitted(g, device_use(listed, NODE, g, done, pending), [G0]) is None

    mem = sum(am for am, *_ in claims) + sum(am for am, _ in unprepared)
    cores = sum(ac for _, ac, *_ in claims) + sum(ac for _, ac in unprepared)
    for i, (am, ac, bm, bc, _) in enumerate(claims):
        if f"u{i}" in pending:
            bm, bc = gm, gc
        mem += max(0, bm - am)
        cores += max(0, bc - ac)
    if fits:
        assert mem <= H100_MIB and cores <= 100
    assert fits == (mem <= H100_MIB and cores <= 100)


# -- the budget file and the Event -------------------------------------------------------------


def test_resized_entries_keep_the_controllers_pacing_and_the_context_charge() -> None:
    (now,) = entries([ALLOC], {G0: 500 * MIB})
    now = replace(now, rate=1234.5, burst=61.7)
    (e,) = resized_entries([UnitBudget(G0, 6 * GIB, 40)], [now])
    assert e == BudgetEntry(index=0, uuid=G0, memory=6 * GIB, cores=40, rate=1234.5,
                            burst=61.7, context=500 * MIB)


def test_resized_entries_start_pacing_afresh_where_a_core_budget_appears_or_goes() -> None:
    (unpaced,) = entries([UnitBudget(G0, 4 * GIB, 100)], {G0: 500 * MIB})
    assert unpaced.cores is None  # all the cores: nothing to pace
    (e,) = resized_entries([UnitBudget(G0, 4 * GIB, 40)], [unpaced])
    assert (e.cores, e.rate, e.context) == (40, INITIAL_RATE, 500 * MIB)
    paced = replace(e, rate=1234.5)
    (e,) = resized_entries([UnitBudget(G0, 8 * GIB, 100)], [paced])
    assert (e.memory, e.cores, e.rate, e.burst, e.context) == (8 * GIB, None, 0.0, 1.0,
                                                               500 * MIB)


def test_resized_entries_of_a_unit_without_a_current_entry_start_fresh() -> None:
    (e,) = resized_entries([UnitBudget(G0, 6 * GIB, 40)], [])
    assert (e.uuid, e.memory, e.cores, e.rate, e.context) == (G0, 6 * GIB, 40, INITIAL_RATE, 0)


def test_the_resized_event_says_each_claims_budget_now() -> None:
    ts = [ClaimTarget(prepared(), (UnitBudget(G0, 6 * GIB, 40),)),
          ClaimTarget(prepared(uid="u2", name="whole"), (UnitBudget(M10, None, None),))]
    assert resized_message(ts) == (
        "budget resized, obeyed from the containers' next GPU call: "
        f"claim {CLAIM}: 6144 MiB, 40% cores of {G0}; "
        f"claim whole: no memory limit, no core limit of {M10}")


# -- what the node publishes -------------------------------------------------------------------


def snapshot() -> DeviceSnapshot:
    m = get_model("H100-80GB")
    return DeviceSnapshot((GPUState(0, G0, m.nvml_name, m.pci_device_id, m.memory_mib << 20, 0,
                                    None, "disabled"),))


def published(state: DraDevices) -> dict[str, str]:
    devices = state.devices()
    assert devices is not None
    (d,) = devices
    return {k: v["value"] for k, v in d["capacity"].items()}


def test_a_daemon_that_may_hold_resizes_publishes_nothing_until_it_knows_them() -> None:
    state = DraDevices(10, reserved_known=False)
    state.update(snapshot(), 1.0, {})
    assert state.devices() is None  # the checkpoint is not read yet
    assert state.gpus() is not None  # the plugin may map claims back meanwhile
    assert state.reserve({}) is True  # nothing held: known now
    full = published(state)
    assert full == {DRA_CAPACITY_MEMORY: str(get_model("H100-80GB").memory_mib * MIB),
                    DRA_CAPACITY_CORES: "100"}
    assert state.reserve({G0: (0, 0)}) is False  # nothing is nothing
    assert state.reserve({G0: (2 * GIB, 10)}) is True
    assert state.reserve({G0: (2 * GIB, 10)}) is False
    assert published(state) == {DRA_CAPACITY_MEMORY: str(int(full[DRA_CAPACITY_MEMORY])
                                                         - 2 * GIB),
                                DRA_CAPACITY_CORES: "90"}
    assert state.reserve({}) is True  # the growth taken back
    assert published(state) == full


def test_a_daemon_without_the_plugin_publishes_at_once() -> None:
    state = DraDevices(10)
    state.update(snapshot(), 1.0, {})
    assert state.devices() is not None


# -- the checkpoint ----------------------------------------------------------------------------


def test_a_resized_claim_keeps_its_allocation_across_a_restart(tmp_path: Path) -> None:
    grown = replace(prepared((UnitBudget(G0, 6 * GIB, 40),), allocated=(ALLOC,)),
                    results=(Result("gpu", NODE, "gpu0", "share-1"),))
    whole = prepared((UnitBudget(M10, None, None),), uid="u2", name="b")
    Checkpoint(tmp_path / "claims.json").put(grown)
    Checkpoint(tmp_path / "claims.json").put(whole)
    again = Checkpoint(tmp_path / "claims.json")
    assert again.get(CLAIM_UID) == grown
    assert again.get("u2") == whole and whole.allocation == whole.units
    assert reserved(again.claims()) == {G0: (2 * GIB, 10)}  # published less after a restart
    raw = json.loads((tmp_path / "claims.json").read_text())
    assert "allocated" not in raw["claims"]["u2"]  # never resized: written as before


def test_a_checkpoint_written_before_resizes_still_loads(tmp_path: Path) -> None:
    old = {"version": 1, "claims": {CLAIM_UID: {
        "namespace": NS, "name": CLAIM,
        "results": [{"request": "gpu", "pool": NODE, "device": "gpu0", "shareID": None}],
        "units": [{"uuid": G0, "memory": 4 * GIB, "cores": 30}],
        "quota": "team/gpus", "weight": 2, "lending": False}}}
    (tmp_path / "claims.json").write_text(json.dumps(old))
    c = Checkpoint(tmp_path / "claims.json").get(CLAIM_UID)
    assert c is not None and c.allocated is None
    assert c.allocation == c.units == (ALLOC,)
    assert (c.weight, c.lending) == (2, False)


@pytest.mark.parametrize(("now", "want", "reserves_more"), [
    # 4 GiB/30 allocated: what a budget takes beyond the allocation decides, not its size
    (UnitBudget(G0, 4 * GIB, 30), UnitBudget(G0, 12 * GIB, 30), True),
    (UnitBudget(G0, 4 * GIB, 30), UnitBudget(G0, 4 * GIB, 40), True),
    (UnitBudget(G0, 12 * GIB, 40), UnitBudget(G0, 8 * GIB, 40), False),  # a shrink
    (UnitBudget(G0, 2 * GIB, 30), UnitBudget(G0, 4 * GIB, 30), False),  # back up to it
    (UnitBudget(G0, 2 * GIB, 20), UnitBudget(G0, 5 * GIB, 20), True),  # past it
])
def test_only_a_budget_taking_more_beyond_its_allocation_needs_capacity_withheld(
        now: UnitBudget, want: UnitBudget, reserves_more: bool) -> None:
    claim = prepared((now,), allocated=(ALLOC,) if now != ALLOC else None)
    assert ClaimTarget(claim, (want,)).reserves_more is reserves_more


def test_a_growth_taken_back_returns_every_claim_of_the_pod_to_its_allocation() -> None:
    """The operator takes a pod's growth back by writing ``{}``: claim A, grown, shrinks to
    its allocation; claim B, shrunk below its allocation, comes back up to it. Neither
    reserves capacity, so the node applies both without an approval (B stayed shrunk before,
    and was found again at every pass)."""
    a = prepared((UnitBudget(G0, 12 * GIB, 40),), allocated=(ALLOC,))
    b = prepared((UnitBudget(M14, 1 * GIB, 10),), uid="0b6c77aa-0000-4000-8000-000000000003",
                 name="other-gpu", allocated=(UnitBudget(M14, 2 * GIB, 20),))
    targets = pod_targets(pod({}, generated={"gpu": CLAIM, "other": "other-gpu"}), [a, b])
    assert {t.claim.name: t.units for t in targets} == {
        CLAIM: (ALLOC,), "other-gpu": (UnitBudget(M14, 2 * GIB, 20),)}
    assert [t.reserves_more for t in targets] == [False, False]
    assert [t.grows for t in targets] == [False, True]  # B grows, within its allocation
