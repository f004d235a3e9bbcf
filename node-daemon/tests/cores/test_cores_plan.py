"""Which containers the core controllers run for (:func:`tessera_node.cores.runner.plan`,
pure): properties over any set of containers the device plugin set up (hypothesis). The
same plan through the device plugin's registry: tests/deviceplugin/test_deviceplugin_resize.py.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.budget import PerShareBudget
from tessera.api.names import VGPU
from tessera_node.cores.runner import plan
from tessera_node.deviceplugin.registry import SetUpContainer

UNITS = ("GPU-a", "GPU-b", "MIG-c", "MIG-d")


@st.composite
def container(draw: st.DrawFn, i: int) -> SetUpContainer:
    units = tuple(draw(st.lists(st.sampled_from(UNITS), min_size=1, max_size=3, unique=True)))
    refused = draw(st.one_of(st.none(), st.just("memory budgets would exceed")))
    cores = draw(st.one_of(st.none(), st.sampled_from([0.0, 10.0, 33.3, 99.9, 100.0])))
    budget = (None if refused is not None or cores is None else
              PerShareBudget(shares=len(units), memory_bytes=draw(st.integers(0, 1 << 36)),
                             cores=cores))
    return SetUpContainer(
        key=f"k{i}", pod_uid=f"uid-{i}", namespace=draw(st.sampled_from(["ns1", "ns2"])),
        pod=f"p{i}", container="main",
        resource=draw(st.sampled_from([VGPU, VGPU, "tessera.dev/mig-1g.10gb"])),
        units=units, gpus=units, budget=budget, refused=refused,
        budget_file=f"/state/k{i}/budget", ledger_dir=f"/state/k{i}/run",
        quota=draw(st.one_of(st.none(), st.just("ns1/gold"))),
        weight=draw(st.integers(1, 1000)), lending=draw(st.booleans()))


containers_st = st.integers(0, 6).flatmap(
    lambda n: st.tuples(*(container(i) for i in range(n))).map(list))
known_st = st.sets(st.sampled_from(UNITS)).map(lambda us: {u: i for i, u in enumerate(us)})


def eligible(c: SetUpContainer) -> bool:
    """Controlled or in a split: a vgpu container with a budget, not refused."""
    return c.budget is not None and c.refused is None and c.resource == VGPU


@settings(max_examples=300, deadline=None)
@given(containers=containers_st, known=known_st)
def test_a_unit_has_a_controller_exactly_when_a_container_there_has_less_than_all_of_it(
        containers: list[SetUpContainer], known: dict[str, int]) -> None:
    """A known unit gets a controller iff a vgpu container with a budget there has a core
    budget below 100; its split then holds every such container on the unit (those with
    the whole unit's cores too), once, with its budget file entry for the unit, its ledger,
    its quota's weight and lending; refused containers, whole MIG instances and containers
    without a budget never take part, and a unit gone from the node has no controller."""
    got = plan(containers, known)
    assert set(got) <= set(known)
    for unit in known:
        there = [c for c in containers if eligible(c) and unit in c.units]
        wanted = any(c.budget is not None and c.budget.cores < 100 for c in there)
        assert (unit in got) == wanted
        if not wanted:
            continue
        specs = got[unit]
        assert sorted(s.name for s in specs) == sorted(c.key for c in there)
        by_key = {c.key: c for c in there}
        for s in specs:
            c = by_key[s.name]
            assert c.units[s.entry] == unit
            assert (s.budget_file, s.ledger) == (c.budget_file, str(c.ledger))
            assert (s.weight, s.lend) == (float(c.weight), c.lending)
            assert (s.owner.namespace, s.owner.pod, s.owner.container) == (
                c.namespace, c.pod, c.container)
            assert s.owner.quota == (c.quota or "").rpartition("/")[2]
