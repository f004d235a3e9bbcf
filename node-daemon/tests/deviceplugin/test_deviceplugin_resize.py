"""The node's part of a live resize, through the device plugin's manager: an approved request
decided against what else is budgeted on the container's GPUs, the budget files rewritten
(all of the pod's containers, or none), the commitments the daemon publishes on its Node;
which containers the core controllers run for (:func:`tessera_node.cores.runner.plan`); and
the decision's properties (hypothesis): an applied resize never overcommits a unit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_deviceplugin_devices import G0, G1, M0
from test_deviceplugin_matching import Cycle, pod

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, ANNOTATION_BUDGET_RESIZE, VGPU
from tessera.api.resize import ResizeStatus
from tessera_node.budget.formats import BudgetEntry
from tessera_node.cores.runner import plan
from tessera_node.deviceplugin.devices import Unit, share_id
from tessera_node.deviceplugin.manager import NodeState
from tessera_node.deviceplugin.matcher import ContainerRef, Held, allocation_key, pod_view
from tessera_node.deviceplugin.resize import Placed, decide_pod

GIB = 1 << 30
PREVIOUS = "{}"


def budget(containers: dict[str, tuple[int, float]], weight: int = 1, lending: bool = True,
           quota: str | None = "team") -> str:
    return BudgetAnnotation(quota=quota, weight=weight, lending=lending, containers={
        name: PerShareBudget(shares=1, memory_bytes=mem, cores=cores)
        for name, (mem, cores) in containers.items()}).to_annotation()


def approve(p: dict[str, object], containers: dict[str, tuple[int, float]]) -> None:
    """What the operator writes when it approves: the new budget, status Approved."""
    ann = p["metadata"]["annotations"]  # type: ignore[index]
    ann[ANNOTATION_BUDGET] = budget(containers)
    ann[ANNOTATION_BUDGET_RESIZE] = ResizeStatus(
        "r1", "Approved", previous=PREVIOUS, grow={"memoryMiB": 1, "cores": 0}).to_annotation()


def running(tmp: Path, pods: dict[str, dict[str, tuple[int, float]]]) -> Cycle:
    """Pods (one share of G0 per container, in order) allocated, confirmed, running."""
    c = Cycle(tmp, [pod(name, {k: {VGPU: 1} for k in cs}, budget=budget(cs))
                    for name, cs in pods.items()])
    held, i = [], 0
    for name, cs in pods.items():
        for k in cs:
            c.m.allocate(VGPU, [share_id(G0, i)])
            held.append(Held(ContainerRef("ns", name, k), VGPU, (share_id(G0, i),)))
            i += 1
    c.m.resolve(held)
    for p in c.pods:
        p["status"] = {"phase": "Running"}
    return c


def key(i: int) -> str:
    return allocation_key(VGPU, [share_id(G0, i)])


@pytest.mark.parametrize(("new", "state", "reason"), [
    ({"main": (30 * GIB, 60)}, "Applied", ""),  # grow: 30 + 40 GiB fit 80
    ({"main": (5 * GIB, 10)}, "Applied", ""),  # shrink
    ({"main": (50 * GIB, 30)}, "Refused",  # 50 + 40 GiB do not
     f"container main: on this node: memory budgets on {G0} would exceed its 81920 MiB "
     "(40960 MiB budgeted, 51200 MiB asked)"),
])
def test_an_approved_resize_is_decided_against_the_other_budgets_on_the_gpu(
    tmp_path: Path, new: dict[str, tuple[int, float]], state: str, reason: str
) -> None:
    c = running(tmp_path, {"a": {"main": (10 * GIB, 30)}, "b": {"main": (40 * GIB, 30)}})
    rate_before = c.writer.read(key(0)).entries[0].rate
    approve(c.pods[0], new)
    out = c.m.resize(pod_view(c.pods[0]))
    assert out is not None and out.status.state == state and out.status.reason == reason
    after = c.writer.read(key(0)).entries[0]
    if state == "Applied":
        assert (after.memory, after.cores) == new["main"]
        assert after.rate == rate_before  # the controller's rate is kept
        assert out.status.previous is None  # nothing for the operator to roll back
        (entry,) = [e for e in c.m.registry.snapshot() if e.pod == "a"]
        assert entry.budget is not None and entry.budget.memory_bytes == new["main"][0]
    else:
        assert (after.memory, after.cores) == (10 * GIB, 30)  # untouched
        assert out.status.previous == PREVIOUS  # the operator restores it and gives back


def test_nothing_to_decide_until_approved_or_until_its_containers_are_set_up(
    tmp_path: Path
) -> None:
    c = running(tmp_path, {"a": {"main": (10 * GIB, 30)}})
    assert c.m.resize(pod_view(c.pods[0])) is None  # no request
    c.pods.append(pod("later", {"main": {VGPU: 1}}, budget=budget({"main": (GIB, 10)})))
    approve(c.pods[1], {"main": (2 * GIB, 10)})
    assert c.m.resize(pod_view(c.pods[1])) is None  # not confirmed here yet: waits


def test_a_pods_containers_are_all_applied_or_none(tmp_path: Path) -> None:
    c = running(tmp_path, {"a": {"x": (10 * GIB, 20), "y": (10 * GIB, 20)},
                           "b": {"main": (40 * GIB, 30)}})
    approve(c.pods[0], {"x": (20 * GIB, 20), "y": (30 * GIB, 20)})  # 20+30+40 > 80
    out = c.m.resize(pod_view(c.pods[0]))
    assert out is not None and out.status.state == "Refused"
    assert out.status.reason.startswith("container y: on this node: memory budgets on")
    assert [c.writer.read(key(i)).entries[0].memory for i in (0, 1)] == [10 * GIB, 10 * GIB]
    approve(c.pods[0], {"x": (20 * GIB, 20), "y": (20 * GIB, 20)})  # 20+20+40 = 80 fits
    out = c.m.resize(pod_view(c.pods[0]))
    assert out is not None and out.applied
    assert [c.writer.read(key(i)).entries[0].memory for i in (0, 1)] == [20 * GIB, 20 * GIB]
    committed = json.loads(c.m.commitments())
    assert committed == {G0: {"memory": 80 * GIB, "committed": 80 * GIB, "containers": 3}}


def test_core_controllers_run_for_units_with_a_core_budget_below_the_whole(
    tmp_path: Path
) -> None:
    c = Cycle(tmp_path, [
        pod("a", {"main": {VGPU: 1}}, budget=budget({"main": (10 * GIB, 20)}, weight=3,
                                                    quota="gold")),
        pod("b", {"main": {VGPU: 1}}, budget=budget({"main": (10 * GIB, 100)},
                                                    lending=False)),
        pod("c", {"main": {VGPU: 1}}, budget=budget({"main": (10 * GIB, 100)})),
    ])
    c.m.update(NodeState(units=[Unit(G0, G0, 0, None, 80 * GIB, True),
                                Unit(G1, G1, 1, None, 80 * GIB, True)]))
    for i, (_name, gpu) in enumerate((("a", G0), ("b", G0), ("c", G1))):
        c.m.allocate(VGPU, [share_id(gpu, i)])
    c.m.resolve([Held(ContainerRef("ns", n, "main"), VGPU, (share_id(g, i),))
                 for i, (n, g) in enumerate((("a", G0), ("b", G0), ("c", G1)))])
    got = plan(c.m.registry.snapshot(), {G0: 0, G1: 1})
    assert list(got) == [G0]  # G1 holds only a container with the whole GPU's cores
    a, b = sorted(got[G0], key=lambda t: t.owner.pod)
    assert (a.owner.namespace, a.owner.pod, a.owner.quota, a.weight, a.lend, a.entry) == \
        ("ns", "a", "gold", 3.0, True, 0)
    assert a.ledger.endswith("/run/ledger") and a.budget_file.endswith("/budget")
    assert (b.owner.pod, b.lend) == ("b", False)  # in the split, as a hard cap
    assert plan(c.m.registry.snapshot(), {G1: 1}) == {}  # G0 gone from the node


def test_a_controlled_container_has_its_series_before_any_period_measures(
    tmp_path: Path
) -> None:
    """An idle GPU gives NVML nothing to sample, so no period reports: the container's
    series and its quota's lent/borrowed counters exist at 0 from the moment it is
    controlled (a dashboard shows 0, not 'no data')."""
    from prometheus_client import REGISTRY

    from tessera_node.cores.runner import CoreControl

    c = running(tmp_path, {"idle": {"main": (10 * GIB, 20)}})

    class NoSamples:
        def process_utilization(self, index: int, since_us: int
                                ) -> tuple[dict[int, float], int] | None:
            return {}, since_us

    cores = CoreControl(c.m.registry.snapshot, {G0: 0}.copy, NoSamples(), 0.1)
    cores.step()
    labels = {"namespace": "ns", "pod": "idle", "container": "main", "gpu": G0}
    assert REGISTRY.get_sample_value("tessera_container_core_busy_seconds_total",
                                     labels) == 0.0
    assert REGISTRY.get_sample_value("tessera_quota_core_lent_seconds_total",
                                     {"namespace": "ns", "quota": "team"}) is not None
    assert list(cores.controllers) == [G0]


# -- properties of the decision (pure): a resize never overcommits a unit -----------------------

UNITS = (G0, G1, M0)
MIB = 1 << 20
memory_st = st.integers(0, 80 * 1024).map(lambda mib: mib * MIB)


@st.composite
def resize_case(draw: st.DrawFn) -> tuple[dict[str, str], list[Placed], dict[str, int | None],
                                          dict[str, list[int]], dict[str, int]]:
    """(the pod's annotations, its containers placed here, each unit's memory, what other
    pods hold there, each container's new memory)."""
    unit_memory = {u: draw(st.one_of(st.none(), st.integers(1, 80).map(lambda g: g * GIB)))
                   for u in UNITS}
    elsewhere = {u: draw(st.lists(memory_st, max_size=3)) for u in UNITS}
    names = draw(st.lists(st.sampled_from(("a", "b", "c")), min_size=1, max_size=3,
                          unique=True))
    placed, new = [], {}
    for i, name in enumerate(names):
        units = draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=3, unique=True))
        cur = draw(memory_st)
        cores = draw(st.one_of(st.none(), st.floats(1, 99)))
        placed.append(Placed(f"k{i}", name, tuple(units), tuple(
            BudgetEntry(index=j, uuid=u, memory=cur, cores=cores, rate=123.0, burst=7.0)
            for j, u in enumerate(units))))
        new[name] = draw(memory_st)
    budgeted = draw(st.sets(st.sampled_from(names)))  # a container missing: refused
    annotations = {
        ANNOTATION_BUDGET: BudgetAnnotation(containers={
            p.container: PerShareBudget(shares=len(p.units), memory_bytes=new[p.container],
                                        cores=draw(st.floats(0, 100)))
            for p in placed if p.container in budgeted}).to_annotation(),
        ANNOTATION_BUDGET_RESIZE: ResizeStatus(
            "r1", "Approved", previous=PREVIOUS,
            grow={"memoryMiB": 1, "cores": 0}).to_annotation()}
    return annotations, placed, unit_memory, elsewhere, new


def _committed(placed: list[Placed], memory: dict[str, int], elsewhere: dict[str, list[int]],
               unit_memory: dict[str, int | None]) -> dict[str, int]:
    """Per unit: what other pods hold plus each of the pod's containers' ``memory``."""
    out = {u: sum(v) for u, v in elsewhere.items()}
    for p in placed:
        for u in p.units:
            out[u] += memory[p.container]
    return out


@settings(max_examples=400, deadline=None)
@given(case=resize_case())
def test_an_applied_resize_never_overcommits_a_unit(
        case: tuple[dict[str, str], list[Placed], dict[str, int | None],
                    dict[str, list[int]], dict[str, int]]) -> None:
    """Applied only when, with every container of the pod at its new budget, no unit's
    memory budgets add up to more than its memory (a unit of unknown memory never fits);
    then every container's new entries carry the new memory and keep the controller's rate
    and burst; refused: nothing is rewritten and the reason names the container."""
    annotations, placed, unit_memory, elsewhere, new = case
    out = decide_pod(annotations, placed, unit_memory, elsewhere)
    assert out is not None
    if not out.applied:
        assert out.entries == {} and out.status.reason.startswith("container ")
        return
    assert set(out.entries) == {p.key for p in placed} and out.budget is not None
    for u, total in _committed(placed, new, elsewhere, unit_memory).items():
        if any(u in p.units for p in placed):
            memory = unit_memory[u]
            assert memory is not None and total <= memory
    for p in placed:
        for before, after in zip(p.current, out.entries[p.key], strict=True):
            assert (after.uuid, after.memory) == (before.uuid, new[p.container])
            if before.cores is not None and after.cores is not None:
                assert (after.rate, after.burst) == (before.rate, before.burst)


@st.composite
def shrink_case(draw: st.DrawFn) -> tuple[dict[str, str], list[Placed], dict[str, int | None],
                                          dict[str, list[int]], dict[str, int]]:
    """A node within its memory (80 GiB units; other pods at most 20 GiB on each, each of
    the pod's at most three containers at most 20 GiB) and a resize growing none of them."""
    unit_memory: dict[str, int | None] = {u: 80 * GIB for u in UNITS}
    elsewhere = {u: [draw(st.integers(0, 20 * 1024)) * MIB] for u in UNITS}
    names = draw(st.lists(st.sampled_from(("a", "b", "c")), min_size=1, max_size=3,
                          unique=True))
    placed, new = [], {}
    for i, name in enumerate(names):
        units = draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=3, unique=True))
        cur = draw(st.integers(0, 20 * 1024)) * MIB
        placed.append(Placed(f"k{i}", name, tuple(units), tuple(
            BudgetEntry(index=j, uuid=u, memory=cur, cores=50) for j, u in enumerate(units))))
        new[name] = draw(st.integers(0, cur // MIB)) * MIB
    annotations = {
        ANNOTATION_BUDGET: BudgetAnnotation(containers={
            n: PerShareBudget(shares=len(p.units), memory_bytes=new[n], cores=10)
            for p in placed for n in [p.container]}).to_annotation(),
        ANNOTATION_BUDGET_RESIZE: ResizeStatus(
            "r1", "Approved", previous=PREVIOUS,
            grow={"memoryMiB": 0, "cores": 0}).to_annotation()}
    return annotations, placed, unit_memory, elsewhere, new


@settings(max_examples=200, deadline=None)
@given(case=shrink_case())
def test_a_resize_that_grows_nothing_on_a_node_that_fits_is_applied(
        case: tuple[dict[str, str], list[Placed], dict[str, int | None],
                    dict[str, list[int]], dict[str, int]]) -> None:
    """Every container at most at its current memory, and the node within its memory now:
    the resize is applied (a shrink is never refused for memory)."""
    annotations, placed, unit_memory, elsewhere, _new = case
    out = decide_pod(annotations, placed, unit_memory, elsewhere)
    assert out is not None and out.applied, out
