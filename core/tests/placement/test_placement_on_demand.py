"""MIG on demand on the device-plugin path (tessera.placement.on_demand, .eligibility): which
instances are asked for pending pods, and whether a pod may run on a node at all. Checked
against the brute-force oracle of valid MIG states (mig_oracle, no code shared with the
planner) and against tessera.mig.ondemand.choose."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_fixtures import mig_unit

from tessera.dra.partitions import Bounds
from tessera.mig.ondemand import choose
from tessera.placement.eligibility import eligible
from tessera.placement.on_demand import OnDemandGpu, PendingPod, WantedInstance, plan
from tessera.placement.units import Unit

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mig"))
from mig_oracle import is_valid_state

H100 = "H100-80GB"


def gpu(node: str, index: int, instances: tuple[tuple[str, int], ...] = (), *,
        profiles: tuple[str, ...] = (), max_instances: int | None = None,
        model: str = H100, partition: str = "lab") -> OnDemandGpu:
    return OnDemandGpu(node, f"GPU-{node}-{index}", index, model, partition,
                       Bounds(profiles, max_instances), instances)


def pod(name: str, *profiles: str, nodes: set[str] | None = None,
        exclude_models: frozenset[str] = frozenset()) -> PendingPod:
    return PendingPod(f"ns/{name}", f"uid-{name}", tuple(profiles),
                      (lambda n: n in nodes) if nodes is not None else (lambda _n: True),
                      lambda model, _gpu: model not in exclude_models)


def on(node: str, u: Unit) -> Unit:
    return replace(u, node=node)


# -- one pod ---------------------------------------------------------------------------------

def test_a_pod_no_instance_holds_gets_one_where_choose_puts_it() -> None:
    gpus = [gpu("n0", 0, (("1g.10gb", 6),)), gpu("n0", 1), gpu("n1", 0, (("3g.40gb", 4),))]
    got = plan([pod("a", "2g.20gb")], gpus, {}, [])
    fleet = [(g.uuid, [mig_unit(g.uuid, p, s) for p, s in g.instances]) for g in gpus]
    want = choose(H100, fleet, "2g.20gb")
    assert want is not None
    assert [(w.gpu, w.start, w.pod, w.pod_uid, w.partition) for w in got] == [
        (want.gpu, want.start, "ns/a", "uid-a", "lab")]
    assert got[0].node == next(g.node for g in gpus if g.uuid == want.gpu)


def test_a_free_instance_of_the_profile_means_nothing_is_made() -> None:
    free = {"n0": [on("n0", mig_unit("GPU-x", "3g.40gb", 0))]}
    assert plan([pod("a", "3g.40gb")], [gpu("n1", 0)], free, []) == []


def test_a_free_instance_serves_one_pod_only_the_next_gets_a_new_one() -> None:
    free = {"n0": [on("n0", mig_unit("GPU-x", "3g.40gb", 0))]}
    got = plan([pod("a", "3g.40gb"), pod("b", "3g.40gb")], [gpu("n1", 0)], free, [])
    assert [(w.pod, w.node, w.profile) for w in got] == [("ns/b", "n1", "3g.40gb")]


def test_nodes_the_pod_may_not_run_on_and_models_it_excludes_get_nothing() -> None:
    gpus = [gpu("n0", 0), gpu("n1", 0, model="A100-40GB")]
    assert plan([pod("a", "2g.20gb", nodes={"n1"})], gpus, {}, []) == []  # no 2g.20gb on A100
    got = plan([pod("a", "2g.20gb", nodes={"n0", "n1"})], gpus, {}, [])
    assert [w.node for w in got] == ["n0"]
    assert plan([pod("a", "2g.20gb", exclude_models=frozenset({H100}))], gpus, {}, []) == []
    # a name both models have (the A100-40GB's double-memory 1g): the pod's policy decides
    assert [w.node for w in plan([pod("a", "1g.10gb", exclude_models=frozenset({H100}))],
                                 gpus, {}, [])] == ["n1"]


def test_bounds_of_the_partition_hold() -> None:
    only_small = [gpu("n0", 0, profiles=("1g.10gb",))]
    assert plan([pod("a", "3g.40gb")], only_small, {}, []) == []
    full = [gpu("n0", 0, (("1g.10gb", 0), ("1g.10gb", 1)), max_instances=2)]
    assert plan([pod("a", "1g.10gb")], full, {}, []) == []
    room = [replace(full[0], bounds=Bounds((), 3))]
    assert len(plan([pod("a", "1g.10gb")], room, {}, [])) == 1


def test_keep_whole_leaves_the_last_empty_gpus_of_a_node_to_whole_gpu_instances() -> None:
    keep = Bounds(keep_whole=1, partition="lab")
    gpus = [replace(gpu("n0", 0), bounds=keep), replace(gpu("n0", 1), bounds=keep)]
    first = plan([pod("a", "1g.10gb")], gpus, {}, [])
    assert len(first) == 1  # two empty, one kept: one may take it
    # the second 1g goes beside the first, never on the last empty GPU
    got = plan([pod("a", "1g.10gb"), pod("b", "1g.10gb")], gpus, {}, [])
    assert len({w.gpu for w in got}) == 1
    # a whole-GPU instance may take the kept GPU; a 3g no longer fits anywhere else
    one = [replace(gpus[0], instances=(("4g.40gb", 0), ("3g.40gb", 4))), gpus[1]]
    assert [w.profile for w in plan([pod("c", "7g.80gb")], one, {}, [])] == ["7g.80gb"]
    assert plan([pod("c", "3g.40gb")], one, {}, []) == []
    # keepWhole counts per node: n1's empty GPU is n1's
    other = [*one, replace(gpu("n1", 0), bounds=keep), replace(gpu("n1", 1), bounds=keep)]
    assert [w.node for w in plan([pod("c", "3g.40gb")], other, {}, [])] == ["n1"]


def test_a_pod_of_several_instances_gets_them_all_on_one_node() -> None:
    gpus = [gpu("n0", 0, (("4g.40gb", 0),)), gpu("n1", 0), gpu("n1", 1)]
    got = plan([pod("a", "3g.40gb", "3g.40gb", "1g.10gb")], gpus, {}, [])
    assert {w.node for w in got} == {"n1"}
    assert sorted(w.profile for w in got) == ["1g.10gb", "3g.40gb", "3g.40gb"]
    # n0 has room for one 3g only: it cannot serve the pod, though it could start it
    assert plan([pod("a", "3g.40gb", "3g.40gb")], gpus[:1], {}, []) == []


def test_a_node_with_a_free_instance_is_preferred_to_making_more() -> None:
    gpus = [gpu("n0", 0, (("3g.40gb", 0),)), gpu("n1", 0)]
    free = {"n0": [on("n0", mig_unit("GPU-n0-0", "3g.40gb", 0))]}
    got = plan([pod("a", "3g.40gb", "1g.10gb")], gpus, free, [])
    assert [(w.node, w.profile) for w in got] == [("n0", "1g.10gb")]


def test_a_pod_that_cannot_fit_anywhere_waits() -> None:
    gpus = [gpu("n0", 0, (("4g.40gb", 0),))]
    assert plan([pod("a", "7g.80gb")], gpus, {}, []) == []


# -- across rounds -----------------------------------------------------------------------------

def test_what_was_asked_stays_where_it_was_while_the_pod_waits() -> None:
    gpus = [gpu("n0", 0), gpu("n0", 1)]
    first = plan([pod("a", "1g.10gb")], gpus, {}, [])
    # the daemon made it: it is present, free, on the GPU asked
    made = first[0]
    gpus2 = [replace(g, instances=((made.profile, made.start),)) if g.uuid == made.gpu else g
             for g in gpus]
    free = {"n0": [replace(mig_unit(made.gpu, made.profile, made.start), node="n0")]}
    again = plan([pod("a", "1g.10gb"), pod("b", "1g.10gb")], gpus2, free, first)
    assert again[0] == made  # kept for a, not handed to b
    assert [w.pod for w in again] == ["ns/a", "ns/b"] and again[1].placement != made.placement
    # a asked elsewhere than choose would pick today: still kept (stable decisions)
    moved = replace(made, gpu="GPU-n0-1", gpu_index=1, start=3)
    assert plan([pod("a", "1g.10gb")], gpus, {}, [moved]) == [moved]


def test_an_ask_goes_when_its_pod_stops_waiting_or_another_pod_took_the_instance() -> None:
    gpus = [gpu("n0", 0, (("1g.10gb", 0),))]
    asked = WantedInstance("n0", "GPU-n0-0", 0, "1g.10gb", 0, "ns/a", "uid-a", "lab")
    assert plan([], gpus, {}, [asked]) == []  # bound, deleted or ended
    # made, not advertised yet (neither free nor held): still a's
    assert plan([pod("a", "1g.10gb")], gpus, {}, [asked]) == [asked]
    # the instance is there and another pod holds it: a gets a new one
    got = plan([pod("a", "1g.10gb")], gpus, {}, [asked], held={asked.placement})
    assert len(got) == 1 and got[0].placement != asked.placement


def test_an_ask_that_no_longer_fits_is_chosen_again() -> None:
    gpus = [gpu("n0", 0, (("7g.80gb", 0),)), gpu("n1", 0)]  # someone made a 7g by hand
    asked = WantedInstance("n0", "GPU-n0-0", 0, "1g.10gb", 3, "ns/a", "uid-a", "lab")
    got = plan([pod("a", "1g.10gb")], gpus, {}, [asked])
    assert [w.node for w in got] == ["n1"]


# -- properties --------------------------------------------------------------------------------

PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


@st.composite
def fleets(draw: st.DrawFn) -> list[OnDemandGpu]:
    out = []
    for n in range(draw(st.integers(1, 3))):
        for i in range(draw(st.integers(1, 2))):
            present: list[tuple[str, int]] = []
            for p in draw(st.lists(st.sampled_from(PROFILES), max_size=4)):
                for s in range(8):
                    if is_valid_state(H100, [*present, (p, s)]):
                        present.append((p, s))
                        break
            limit = draw(st.one_of(st.none(), st.integers(1, 7)))
            if limit is not None and limit < len(present):
                limit = len(present)
            out.append(gpu(f"n{n}", i, tuple(present), max_instances=limit))
    return out


@settings(max_examples=150, deadline=None)
@given(fleets(), st.lists(st.lists(st.sampled_from(PROFILES), min_size=1, max_size=3),
                          max_size=6))
def test_every_answer_is_a_valid_layout_within_bounds_one_node_per_pod(
        gpus: list[OnDemandGpu], asks: list[list[str]]) -> None:
    pods = [pod(f"p{i}", *a) for i, a in enumerate(asks)]
    got = plan(pods, gpus, {}, [])
    by_gpu: dict[str, list[tuple[str, int]]] = {g.uuid: list(g.instances) for g in gpus}
    for w in got:
        by_gpu[w.gpu].append((w.profile, w.start))
    for g in gpus:
        assert is_valid_state(H100, by_gpu[g.uuid]), by_gpu[g.uuid]
        limit = g.bounds.max_instances
        assert limit is None or len(by_gpu[g.uuid]) <= max(limit, len(g.instances))
    for p in pods:
        mine = [w for w in got if w.pod_uid == p.uid]
        assert len({w.node for w in mine}) <= 1
        assert not mine or sorted(w.profile for w in mine) == sorted(p.profiles)
    # asked again with the answer as what was asked before: the same answer (stable)
    assert plan(pods, gpus, {}, got) == got


# -- eligibility -------------------------------------------------------------------------------

LABELS = {"pool": "a", "zone": "z1", "gpus": "4"}


def ok(spec: dict[str, Any], taints: list[dict[str, Any]] | None = None,
       unschedulable: bool = False) -> bool:
    return eligible(spec, "node-0", LABELS, taints or [], unschedulable)


def term(*exprs: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"matchExpressions": list(exprs), **({"matchFields": list(fields)} if fields else {})}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}}


def test_node_selector_and_required_affinity_as_the_scheduler_reads_them() -> None:
    assert ok({}) and ok({"nodeSelector": {"pool": "a"}})
    assert not ok({"nodeSelector": {"pool": "b"}}) and not ok({"nodeSelector": {"x": "a"}})
    cases = [
        ({"key": "pool", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "absent", "operator": "NotIn", "values": ["a"]}, True),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "zone", "operator": "DoesNotExist"}, False),
        ({"key": "gpus", "operator": "Gt", "values": ["3"]}, True),
        ({"key": "gpus", "operator": "Lt", "values": ["3"]}, False),
        ({"key": "pool", "operator": "Gt", "values": ["3"]}, False),  # not an integer
    ]
    for expr, want in cases:
        assert ok(required(term(expr))) is want, expr
    # terms are ORed, expressions ANDed; an empty term or term list matches nothing
    no = {"key": "pool", "operator": "In", "values": ["b"]}
    yes = {"key": "pool", "operator": "In", "values": ["a"]}
    assert ok(required(term(no), term(yes))) and not ok(required(term(no, yes)))
    assert not ok(required(term())) and not ok(required())
    name = {"key": "metadata.name", "operator": "In", "values": ["node-0"]}
    assert ok(required(term(fields=(name,))))
    assert not ok(required(term(fields=({**name, "values": ["node-1"]},))))


def test_taints_need_tolerations_and_a_cordoned_node_admits_no_one_else() -> None:
    gpu_taint = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
    assert not ok({}, [gpu_taint])
    assert ok({}, [{**gpu_taint, "effect": "PreferNoSchedule"}])  # only ranks
    tolerations = [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "value": "true"}, True),
        ({"key": "nvidia.com/gpu", "value": "false"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
    ]
    for tol, want in tolerations:
        assert ok({"tolerations": [tol]}, [gpu_taint]) is want, tol
    assert not ok({}, unschedulable=True)
    assert ok({"tolerations": [{"key": "node.kubernetes.io/unschedulable",
                                "operator": "Exists", "effect": "NoSchedule"}]},
              unschedulable=True)
