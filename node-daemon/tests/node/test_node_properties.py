"""What a reconcile pass computes (:func:`tessera_node.node.content.node_content`) and the
reports in it (:mod:`tessera_node.node.reports`), over arbitrary nodes, GPUs, partitions,
holders and enactor outcomes (hypothesis): only the daemon's own keys, nothing to write
once written, never a false Ready, never an inventory emptied by an NVML error."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from test_node_logic import gpu, partition_obj

from tessera.api.names import ANNOTATION_GPUS, ANNOTATION_PARTITION_STATUS
from tessera.api.partition import NodePartitionStatus
from tessera.mig.planner import feasible_layouts
from tessera_node.device.state import DeviceSnapshot
from tessera_node.layout.plan import GPUPlan, Outcome
from tessera_node.node import reports
from tessera_node.node.content import NodeContent, node_content
from tessera_node.node.patch import OWNED_ANNOTATIONS, OWNED_LABELS, node_patch

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MODELS = ("H100-80GB", "A100-40GB", "A30-24GB")
LAYOUTS = [(), *feasible_layouts("H100-80GB")[::40], *feasible_layouts("A100-40GB")[::40]]
"""Layouts partitions ask for (``()``: MIG disabled), in both models' profile names: an H100
layout selecting an A100 does not fit it."""
PHASES = ("Pending", "Applying", "WaitingForIdle", "Ready", "Failed")


@st.composite
def gpus_st(draw: st.DrawFn) -> DeviceSnapshot:
    out = []
    for i in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(MODELS))
        mig = draw(st.sampled_from(["disabled", "enabled"]))
        layout = draw(st.sampled_from([(), *feasible_layouts(model)[::25]])) \
            if mig == "enabled" else ()
        out.append(gpu(i, model, mig, tuple(layout)))
    return DeviceSnapshot(tuple(out))


def layout_spec(names: tuple[str, ...]) -> dict[str, object]:
    if not names:
        return {"migMode": "Disabled"}
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return {"profiles": [{"name": n, "count": c} for n, c in sorted(counts.items())]}


@st.composite
def partitions_st(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 3))):
        meta: dict[str, object] = {}
        if draw(st.integers(0, 4)) == 0:
            meta["deletionTimestamp"] = "2026-01-03T00:00:00Z"
        obj = partition_obj(f"p{i}", f"2026-01-0{i + 1}T00:00:00Z",
                            layout_spec(draw(st.sampled_from(LAYOUTS))), **meta)
        spec = obj["spec"]
        assert isinstance(spec, dict)
        spec["disruptionPolicy"] = draw(st.sampled_from(["WaitForIdle", "Refuse"]))
        spec["deletionPolicy"] = draw(st.sampled_from(["Retain", "Reset"]))
        out.append(obj)
    return out


@st.composite
def situation_st(draw: st.DrawFn) -> dict[str, Any]:
    snapshot = draw(gpus_st())
    devices = [g.uuid for g in snapshot.gpus] + [i.uuid for g in snapshot.gpus
                                                  for i in g.instances]
    holders = draw(st.dictionaries(st.sampled_from(devices), st.just(["ns/busy"]), max_size=2))
    outcomes = draw(st.dictionaries(
        st.integers(0, 2), st.builds(Outcome, st.sampled_from(PHASES), st.just("said so"),
                                     st.sampled_from([None, "CommandFailed"])), max_size=2))
    return {"snapshot": snapshot, "partitions": draw(partitions_st()), "holders": holders,
            "outcomes": outcomes, "allow_reset": draw(st.booleans()),
            "sockets": draw(st.sampled_from([(), ("nvidia-gpu.sock",)]))}


def compute(node: dict[str, Any], s: dict[str, Any], now: datetime = NOW,
            snapshot: DeviceSnapshot | str | None = "given") -> NodeContent:
    snap = s["snapshot"] if snapshot == "given" else snapshot
    outcomes = s["outcomes"]

    def outcome(p: GPUPlan) -> Outcome | None:
        return outcomes.get(p.index)  # type: ignore[no-any-return]

    return node_content(node, s["partitions"], snap,  # type: ignore[arg-type]
                        None if snap is not None else "NVML: Unknown Error", s["sockets"],
                        "/dp", outcome, now, s["holders"], s["allow_reset"])


def written(node: dict[str, Any], c: NodeContent) -> dict[str, Any]:
    """The Node after the daemon's patch (its other keys left alone)."""
    meta = node["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in OWNED_LABELS}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k not in OWNED_ANNOTATIONS}
    return {"metadata": {**meta, "resourceVersion": "2", "labels": {**labels, **c.labels},
                         "annotations": {**annotations, **c.annotations}}}


NODE: dict[str, Any] = {"metadata": {"name": "n", "resourceVersion": "1",
                                     "labels": {"team": "x"}, "annotations": {"other": "y"}}}


@settings(max_examples=150, deadline=None)
@given(s=situation_st())
def test_a_pass_writes_only_its_keys_and_nothing_once_written(s: dict[str, Any]) -> None:
    """Only the daemon's own labels and annotations; and once they are on the Node, the
    next pass (later, nothing else changed) writes nothing: an idle daemon makes no API
    writes, and a report's lastUpdateTime moves only when its content does."""
    first = compute(NODE, s)
    assert set(first.labels) <= set(OWNED_LABELS)
    assert set(first.annotations) <= set(OWNED_ANNOTATIONS)
    node = written(NODE, first)
    again = compute(node, s, NOW + timedelta(minutes=5))
    assert node_patch(node, again.labels, again.annotations) is None
    assert again.reports == first.reports
    assert again.new_findings == ()


@settings(max_examples=150, deadline=None)
@given(s=situation_st())
def test_never_a_false_ready_and_one_entry_per_partition_with_gpus_here(
        s: dict[str, Any]) -> None:
    """An entry is Ready only when every GPU its partition owns here has its layout (an
    empty plan); plans exist only for GPUs NVML shows, each for a partition with an entry;
    every entry is about its partition's generation; a GPU can belong to one partition."""
    c = compute(NODE, s)
    by_partition: dict[str, list[GPUPlan]] = {}
    for p in c.plans:
        by_partition.setdefault(p.target.partition, []).append(p)
    shown = {g.index for g in s["snapshot"].gpus}
    assert {p.index for p in c.plans} <= shown
    assert len({p.index for p in c.plans}) == len(c.plans)
    for name, entry in c.reports.items():
        assert entry.observed_generation == 2
        assert entry.last_update_time == NOW
        if entry.phase == "Ready":
            assert all(p.done for p in by_partition.get(name, []))
    assert set(by_partition) <= set(c.reports)
    live = {o["metadata"]["name"] for o in s["partitions"]}
    assert set(c.reports) <= live


@settings(max_examples=100, deadline=None)
@given(s=situation_st())
def test_an_unreadable_nvml_never_empties_the_inventory(s: dict[str, Any]) -> None:
    """NVML failing: the inventory on the Node stays as it was, no plan is made, and every
    entry of a partition owning a GPU here is Failed, saying why."""
    node = written(NODE, compute(NODE, s))
    down = compute(node, s, snapshot=None)
    meta = node["metadata"]
    assert down.labels == {k: v for k, v in meta["labels"].items() if k in OWNED_LABELS}
    assert down.annotations.get(ANNOTATION_GPUS) == meta["annotations"].get(ANNOTATION_GPUS)
    assert down.plans == ()
    for name, entry in down.reports.items():
        if entry.reason != "LayoutDoesNotFit":
            assert entry.phase == "Failed" and "NVML: Unknown Error" in (entry.message or ""), \
                name
    if not down.reports:
        assert ANNOTATION_PARTITION_STATUS not in down.annotations


# -- reports: merge and Events ------------------------------------------------------------------

entry_st = st.builds(NodePartitionStatus, phase=st.sampled_from(PHASES),
                     observed_generation=st.integers(1, 3),
                     message=st.sampled_from([None, "a", "b"]),
                     reason=st.sampled_from([None, "InUse"]))
entries_st = st.dictionaries(st.sampled_from(["p0", "p1", "p2"]), entry_st, max_size=3)


@settings(max_examples=300, deadline=None)
@given(old=entries_st, new=entries_st)
def test_merge_stamps_only_what_changed_and_events_say_only_what_is_news(
        old: dict[str, NodePartitionStatus], new: dict[str, NodePartitionStatus]) -> None:
    """Merged: exactly the new partitions; an entry equal to the one written before keeps
    the old one (its time too), any other is the new one stamped now. Events: none for an
    entry as written before, one for each partition whose phase or generation moved (or,
    Failed, whose message did), Ready ones as NodeReady."""
    before = {k: v.model_copy(update={"last_update_time": NOW}) for k, v in old.items()}
    later = NOW + timedelta(hours=1)
    merged = reports.merge(before, new, later)
    assert set(merged) == set(new)
    for k, e in merged.items():
        if k in before and before[k].model_copy(update={"last_update_time": None}) == new[k]:
            assert e is before[k]
        else:
            assert e == new[k].model_copy(update={"last_update_time": later})
    assert reports.events("n", merged, merged) == []
    said = {e.partition: e for e in reports.events("n", before, merged)}
    for k, e in merged.items():
        prev = before.get(k)
        moved = prev is None or (prev.phase, prev.observed_generation) != (
            e.phase, e.observed_generation) or (e.phase == "Failed" and
                                                prev.message != e.message)
        assert (k in said) == moved
        if moved:
            assert said[k].reason == f"Node{e.phase}"
            assert said[k].type == ("Normal" if e.phase in ("Ready", "Applying") else "Warning")
