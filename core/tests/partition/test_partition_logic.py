"""GPUPartition resolution: selection, claims, layout checks, conditions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.conditions import get_condition
from tessera.api.inventory import GPUInventory, from_node, node_labels, to_annotation
from tessera.api.node_report import ANNOTATION_PARTITION_STATUS
from tessera.api.node_report import to_annotation as to_report_annotation
from tessera.api.partition import (
    GPUPartitionSpec,
    GPUStatus,
    MigInstanceStatus,
    NodePartitionStatus,
)
from tessera.partition import PartitionView, aggregate, resolve, spec_errors, transitions
from tessera.partition.logic import bounded_reports


def node(name: str, model: str = "H100-80GB", n: int = 2, **labels: str) -> Any:
    gpus = [GPUInventory(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=81559)
            for i in range(n)]
    return from_node({"metadata": {"name": name, "labels": {**node_labels(gpus), **labels},
                                   "annotations": {"tessera.dev/gpus": to_annotation(gpus)}}})


def spec(profiles: dict[str, int] | None = None, selector: dict[str, Any] | None = None,
         **gpus: Any) -> GPUPartitionSpec:
    layout: dict[str, Any] = ({"migMode": "Disabled"} if profiles is None else
                              {"profiles": [{"name": k, "count": v} for k, v in profiles.items()]})
    raw: dict[str, Any] = {"nodeSelector": selector or {}, "layout": layout}
    if gpus:
        raw["gpus"] = gpus
    return GPUPartitionSpec.model_validate(raw)


def pv(name: str, s: GPUPartitionSpec, created: str = "2026-01-01T00:00:00Z", gen: int = 1,
       nodes: dict[str, NodePartitionStatus] | None = None) -> PartitionView:
    return PartitionView(name, s, gen, created, nodes or {})


def test_selection_follows_labels_and_gpu_filter() -> None:
    nodes = [node("a", pool="x"), node("b", pool="y"), node("c", model="A100-40GB", pool="x")]
    r = resolve([pv("p", spec({"3g.40gb": 2}, {"matchLabels": {"pool": "x"}},
                              models=["H100-80GB"]))], nodes)["p"]
    assert r.selected == ["a"]
    assert [(c.node, c.index) for c in r.claims] == [("a", 0), ("a", 1)]
    r = resolve([pv("p", spec(None, indices=[1]))], nodes)["p"]
    assert r.selected == ["a", "b", "c"] and {c.index for c in r.claims} == {1}


def test_later_partition_loses_contested_gpu_whatever_the_input_order() -> None:
    nodes = [node("a")]
    old = pv("zzz", spec({"7g.80gb": 1}), created="2026-01-01T00:00:00Z")
    new = pv("aaa", spec(None, indices=[0]), created="2026-01-02T00:00:00Z")
    for order in ([old, new], [new, old]):
        r = resolve(order, nodes)
        assert len(r["zzz"].claims) == 2
        assert r["aaa"].claims == []
        assert r["aaa"].problems[0].reason == "GPUClaimed"
        assert "gpupartition/zzz" in r["aaa"].problems[0].message


def test_layout_checked_per_gpu_model() -> None:
    nodes = [node("h", model="H100-80GB"), node("a", model="A30-24GB")]
    r = resolve([pv("p", spec({"3g.40gb": 2}))], nodes)["p"]
    assert {c.node for c in r.claims} == {"h"}
    assert {(pr.node, pr.reason) for pr in r.problems} == {("a", "LayoutDoesNotFit")}


def test_unreadable_inventory_is_a_problem_not_a_crash() -> None:
    bad = from_node({"metadata": {"name": "x", "labels": {},
                                  "annotations": {"tessera.dev/gpus": "[{"}}})
    r = resolve([pv("p", spec(None))], [bad])["p"]
    assert r.selected == ["x"] and r.problems[0].reason == "InventoryUnreadable"


def entry(phase: str, gen: int = 1, msg: str | None = None) -> NodePartitionStatus:
    return NodePartitionStatus(phase=phase, observed_generation=gen, message=msg)  # type: ignore[arg-type]


def conds(p: PartitionView, nodes: list[Any]) -> dict[str, tuple[str, str, str]]:
    st = aggregate(p, resolve([p], nodes)[p.name], None)
    return {c.type: (c.status, c.reason, c.message) for c in st.conditions}


def test_ready_only_when_every_node_applied_the_current_generation() -> None:
    nodes = [node("a"), node("b")]
    s = spec({"1g.10gb": 7})
    c = conds(pv("p", s, gen=2, nodes={"a": entry("Ready", 2)}), nodes)
    assert c["Ready"][:2] == ("False", "Applying")
    assert c["Progressing"][0] == "True" and "b (no report)" in c["Progressing"][2]
    c = conds(pv("p", s, gen=2, nodes={"a": entry("Ready", 2), "b": entry("Ready", 1)}), nodes)
    assert "b (generation 1, want 2)" in c["Progressing"][2]
    c = conds(pv("p", s, gen=2, nodes={"a": entry("Ready", 2), "b": entry("Ready", 2)}), nodes)
    assert c["Ready"][:2] == ("True", "Applied") and c["Progressing"][0] == "False"
    assert c["Degraded"][0] == "False"


def test_failed_node_degrades_naming_node_and_reason() -> None:
    nodes = [node("a"), node("b")]
    c = conds(pv("p", spec(None), nodes={"a": entry("Ready"),
                                         "b": entry("Failed", msg="GPU 1 busy")}), nodes)
    assert c["Degraded"] == ("True", "NodeFailed", "b: GPU 1 busy")
    assert c["Ready"][:2] == ("False", "Degraded")


def test_no_nodes_selected_and_deselected_entries_removed() -> None:
    p = pv("p", spec(None, {"matchLabels": {"pool": "none"}}), nodes={"a": entry("Ready")})
    st = aggregate(p, resolve([p], [node("a")])["p"], None)
    assert st.nodes == {}
    assert st.selected_node_count == 0
    assert next(c for c in st.conditions if c.type == "Ready").reason == "NoNodesSelected"


def test_conditions_are_stable_when_nothing_changes() -> None:
    """Re-aggregating an unchanged partition gives the same status: no write, no churn."""
    nodes = [node("a")]
    p = pv("p", spec(None), nodes={"a": entry("Applying")})
    st1 = aggregate(p, resolve([p], nodes)["p"], None)
    st2 = aggregate(p, resolve([p], nodes)["p"], st1)
    assert st1 == st2
    assert transitions(st1.conditions, st2.conditions) == []
    p2 = pv("p", spec(None), nodes={"a": entry("Ready")})
    st3 = aggregate(p2, resolve([p2], nodes)["p"], st2)
    changed = {c.type for c in transitions(st2.conditions, st3.conditions)}
    assert changed == {"Ready", "Progressing"}
    ready = get_condition(st3.conditions, "Ready")
    assert ready is not None and ready.status == "True"


def test_many_nodes_are_summarised_in_messages() -> None:
    nodes = [node(f"n{i:02d}") for i in range(20)]
    c = conds(pv("p", spec(None)), nodes)
    assert c["Progressing"][2].endswith("and 12 more")


@pytest.mark.parametrize(("s", "bad"), [
    (spec({"7g.80gb": 2}), True),
    (spec({"3g.40gb": 2}, models=["A30-24GB"]), True),
    (spec({"3g.40gb": 2}), False),
    (spec(None), False),
    (spec({"1g.6gb": 4}, {"matchLabels": {"tessera.dev/gpu.product": "A30-24GB"}}), False),
])
def test_spec_errors_only_for_layouts_no_candidate_model_holds(s: GPUPartitionSpec,
                                                               bad: bool) -> None:
    errs = spec_errors(s)
    assert bool(errs) == bad
    if errs:
        assert errs[0][0] == "spec.layout" and "fits no GPU model" in errs[0][1]


def test_status_nodes_are_the_selected_nodes_reports_only() -> None:
    """The operator copies reports of selected nodes into status.nodes, nothing else."""
    p = pv("p", spec(None, {"matchLabels": {"pool": "x"}}),
           nodes={"a": entry("Ready"), "b": entry("Applying"), "c": entry("Ready")})
    nodes = [node("a", pool="x"), node("b", pool="x"), node("c", pool="y")]
    st = aggregate(p, resolve([p], nodes)["p"], None)
    assert st.nodes == {"a": entry("Ready"), "b": entry("Applying")}
    assert st.selected_nodes == ["a", "b"] and st.ready_node_count == 1


def test_node_reports_round_trip_through_the_node_annotation() -> None:
    reports = {"p": NodePartitionStatus(phase="Ready", observed_generation=3, gpus=[
        GPUStatus(index=0, mig_enabled=True, instances=[
            MigInstanceStatus(profile="3g.40gb", start=4, uuid="MIG-x")])])}
    raw = to_report_annotation(reports)
    inv = from_node({"metadata": {"name": "a", "labels": {}, "annotations": {
        "tessera.dev/gpus": "[]", ANNOTATION_PARTITION_STATUS: raw}}})
    assert inv.report("p") == reports["p"] and inv.report("q") is None
    assert inv.report_error is None


def test_an_unreadable_report_fails_the_node_instead_of_waiting_forever() -> None:
    bad_entry = json.dumps({"p": {"phase": "Done"}, "q": {"phase": "Ready"}})
    inv = from_node({"metadata": {"name": "a", "annotations": {
        ANNOTATION_PARTITION_STATUS: bad_entry}}})
    p_report, q_report = inv.report("p"), inv.report("q")
    assert p_report is not None and p_report.phase == "Failed"
    assert "unreadable report (phase" in (p_report.message or "")
    assert q_report is not None and q_report.phase == "Ready"
    broken = from_node({"metadata": {"name": "a", "annotations": {
        ANNOTATION_PARTITION_STATUS: "[1]"}}})
    any_report = broken.report("whatever")
    assert any_report is not None and any_report.phase == "Failed"
    assert "must be a JSON object" in (any_report.message or "")
    c = conds(pv("p", spec(None), nodes={"a": any_report}), [node("a")])
    assert c["Degraded"][:2] == ("True", "NodeFailed")


def _full_report(node: str) -> NodePartitionStatus:
    """8 GPUs with seven 1g instances each, as a daemon reports them (about 6 KB)."""
    return NodePartitionStatus(phase="Ready", observed_generation=1, gpus=[
        GPUStatus(index=i, uuid=f"GPU-{node}-{i}", model="H100-80GB", mig_enabled=True,
                  instances=[MigInstanceStatus(profile="1g.10gb", start=j, size=1, gi_id=j,
                                               ci_id=0, uuid=f"MIG-{node}-{i}-{j}")
                             for j in range(7)]) for i in range(8)])


def test_large_partitions_keep_status_under_the_etcd_object_limit() -> None:
    """250 full reports would be ~1.5 MB (etcd's limit): past the budget the entries keep
    phase/generation/message and drop the GPU detail, which stays on the Nodes."""
    small = {f"n{i}": _full_report(f"n{i}") for i in range(10)}
    assert bounded_reports(small) == small
    big = {f"n{i:03d}": _full_report(f"n{i:03d}") for i in range(250)}
    full_size = sum(len(json.dumps(r.to_dict())) for r in big.values())
    assert full_size > 1_400_000
    out = bounded_reports(big)
    assert set(out) == set(big)
    assert all(r.gpus == [] and r.phase == "Ready" and r.observed_generation == 1
               for r in out.values())
    assert sum(len(json.dumps(r.to_dict())) for r in out.values()) < 20_000
    p = pv("p", spec(None), nodes=big)
    st = aggregate(p, resolve([p], [node(n) for n in big])["p"], None)
    assert st.ready_node_count == 250 and st.nodes == out


# -- properties -----------------------------------------------------------------------------

_NODES = st.lists(st.tuples(st.sampled_from(["H100-80GB", "A100-40GB"]), st.integers(1, 4),
                            st.sampled_from(["x", "y"])), min_size=1, max_size=5)
_PARTS = st.lists(st.tuples(st.sampled_from([None, "x", "y"]),
                            st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=1,
                                                          max_size=3, unique=True)),
                            st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
                            st.sampled_from([None, {"1g.10gb": 2}, {"7g.80gb": 1}])),
                  min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(_NODES, _PARTS)
def test_no_gpu_is_claimed_twice_and_each_goes_to_the_oldest_that_can_hold_it(
        raw_nodes: list[tuple[str, int, str]],
        raw_parts: list[tuple[str | None, list[int] | None, str, dict[str, int] | None]]
) -> None:
    nodes = [node(f"n{i}", model, n, pool=pool) for i, (model, n, pool) in enumerate(raw_nodes)]
    parts = [pv(f"p{i}", spec(profiles, {"matchLabels": {"pool": pool}} if pool else None,
                              **({"indices": idx} if idx else {})), created)
             for i, (pool, idx, created, profiles) in enumerate(raw_parts)]
    out = resolve(parts, nodes)
    claims = [(c.node, c.index, name) for name, r in out.items() for c in r.claims]
    assert len({(n, i) for n, i, _ in claims}) == len(claims), "a GPU claimed twice"
    by_gpu = {(n, i): name for n, i, name in claims}
    ordered = sorted(parts, key=lambda p: (p.created, p.name))
    for (n, i), owner in by_gpu.items():
        # no older partition that selects this GPU and can hold its layout lost it
        for p in ordered:
            if p.name == owner:
                break
            assert all((c.node, c.index) != (n, i) for c in out[p.name].claims)
            assert not any(pr.node == n and f"GPU {i} " in pr.message + " "
                           and pr.reason == "GPUClaimed" for pr in out[p.name].problems)
    # the same answer whatever order the partitions and nodes come in
    again = resolve(list(reversed(parts)), list(reversed(nodes)))
    assert {k: [(c.node, c.index) for c in r.claims] for k, r in again.items()} == {
        k: [(c.node, c.index) for c in r.claims] for k, r in out.items()}
