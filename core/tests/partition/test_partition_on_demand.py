"""GPUPartition migMode OnDemand: what admission refuses (spec_errors) and what a selected GPU
that cannot serve the partition reports (resolve), per GPU model.

The most instances a GPU holds is checked against the brute-force oracle of the MIG tests
(``core/tests/mig/mig_oracle.py``, written from docs/mig.md alone), not the planner.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tessera.models
from tessera.api.inventory import GPUInventory, from_node, node_labels, to_annotation
from tessera.api.partition import GPUPartitionSpec
from tessera.mig.catalog import profiles
from tessera.models import MODELS, GPUModel
from tessera.partition import PartitionView, aggregate, resolve, spec_errors
from tessera.partition.logic import max_instances

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mig"))
from mig_oracle import all_states

MIG_MODELS = [m.id for m in MODELS if m.mig_capable]
ALL_NAMES = sorted({p.name for m in MIG_MODELS for p in profiles(m)})
PRODUCT = "tessera.dev/gpu.product"
NO_MIG = "L4-24GB"
"""A model without MIG; tessera's table has none, so the tests add one (``no_mig_model``)."""


def on_demand(bounds: dict[str, Any] | None = None, selector: dict[str, Any] | None = None,
              **extra: Any) -> GPUPartitionSpec:
    layout: dict[str, Any] = {"migMode": "OnDemand"}
    if bounds is not None:
        layout["onDemand"] = bounds
    return GPUPartitionSpec.model_validate(
        {"nodeSelector": selector or {}, "layout": layout, **extra})


def product(model: str) -> dict[str, Any]:
    return {"matchLabels": {PRODUCT: model}}


def node(name: str, model: str, n: int = 2) -> Any:
    gpus = [GPUInventory(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=24576)
            for i in range(n)]
    return from_node({"metadata": {"name": name, "labels": node_labels(gpus),
                                   "annotations": {"tessera.dev/gpus": to_annotation(gpus)}}})


def pv(name: str, s: GPUPartitionSpec, created: str = "2026-01-01T00:00:00Z") -> PartitionView:
    return PartitionView(name, s, 1, created)


@pytest.fixture
def no_mig_model(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A GPU model without MIG in tessera's model table for the test's duration."""
    model = GPUModel(id=NO_MIG, nvml_names=("NVIDIA L4",), pci_device_ids=(0x27B810DE,),
                     memory_mib=23034, sm_count=58, mig_capable=False)
    monkeypatch.setitem(tessera.models._BY_ID, NO_MIG, model)
    yield NO_MIG


def oracle_max(model: str, allowed: set[str] | None) -> int:
    """Most instances of ``allowed`` (every profile when None) that coexist on one GPU."""
    return max(len(s) for s in all_states(model, True)
               if allowed is None or all(name in allowed for name, _ in s))


# -- admission: what every model accepts ----------------------------------------------------

@pytest.mark.parametrize("selector", [None, *(product(m) for m in MIG_MODELS)],
                         ids=lambda s: "any" if s is None else s["matchLabels"][PRODUCT])
def test_on_demand_without_bounds_is_accepted_on_every_mig_model(
        selector: dict[str, Any] | None) -> None:
    assert spec_errors(on_demand(None, selector)) == []
    assert spec_errors(on_demand({}, selector)) == []


def test_the_most_instances_per_gpu_are_seven_and_four_on_the_a30() -> None:
    assert {m: max_instances(m) for m in MIG_MODELS} == {
        m: 4 if m == "A30-24GB" else 7 for m in MIG_MODELS}
    assert spec_errors(on_demand({"maxInstances": 7})) == []
    assert spec_errors(on_demand({"maxInstances": 4}, product("A30-24GB"))) == []
    assert spec_errors(on_demand({"maxInstances": 5}, product("A30-24GB"))) == [
        ("spec.layout.onDemand.maxInstances",
         "5 instances never fit on one GPU: A30-24GB holds at most 4; set maxInstances to 4 "
         "or less")]
    # a bound between two candidates' limits fits one of them: accepted
    assert spec_errors(on_demand({"maxInstances": 7},
                                 gpus={"models": ["A30-24GB", "H100-80GB"]})) == []


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MIG_MODELS), st.data())
def test_max_instances_is_what_the_allowed_profiles_fit_on_one_gpu(model: str,
                                                                     data: Any) -> None:
    own = [p.name for p in profiles(model)]
    allowed = data.draw(st.one_of(st.none(), st.lists(st.sampled_from(own), min_size=1,
                                                      max_size=len(own), unique=True)))
    limit = oracle_max(model, None if allowed is None else set(allowed))
    assert max_instances(model, None if allowed is None else tuple(allowed)) == limit
    wanted = data.draw(st.integers(1, 7))
    bounds: dict[str, Any] = {"maxInstances": wanted}
    if allowed is not None:
        bounds["profiles"] = allowed
    errs = spec_errors(on_demand(bounds, gpus={"models": [model]}))
    if wanted <= limit:
        assert errs == []
    else:
        assert [f for f, _ in errs] == ["spec.layout.onDemand.maxInstances"]
        assert f"{model} holds at most {limit}; set maxInstances to {limit} or less" in errs[0][1]


def test_keep_whole_needs_a_whole_gpu_profile_among_the_allowed() -> None:
    assert spec_errors(on_demand({"keepWhole": 1})) == []
    assert spec_errors(on_demand({"keepWhole": 2, "profiles": ["7g.80gb", "1g.10gb"]})) == []
    errs = spec_errors(on_demand({"keepWhole": 1, "profiles": ["1g.10gb"]},
                                 gpus={"models": ["H100-80GB"]}))
    assert errs == [("spec.layout.onDemand.keepWhole",
                     "keepWhole keeps GPUs for an instance of the whole GPU, but "
                     "onDemand.profiles allows none (H100-80GB: 7g.80gb): add one, or drop "
                     "keepWhole")]


def test_max_instances_of_restricted_profiles_names_them() -> None:
    errs = spec_errors(on_demand({"profiles": ["3g.40gb"], "maxInstances": 3}))
    assert errs == [("spec.layout.onDemand.maxInstances",
                     "3 instances of 3g.40gb never fit on one GPU: A100-80GB holds at most 2, "
                     "the most of any GPU model tessera knows; set maxInstances to 2 or less")]


# -- admission: profiles --------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(st.sampled_from(MIG_MODELS),
       st.lists(st.sampled_from([*ALL_NAMES, "1c.3g.40gb", "8g.99gb"]), min_size=1,
                max_size=6, unique=True))
def test_each_profile_must_be_one_of_the_models(model: str, names: list[str]) -> None:
    own = [p.name for p in profiles(model)]
    errs = spec_errors(on_demand({"profiles": names}, product(model)))
    bad = [i for i, n in enumerate(names) if n not in own]
    assert [f for f, _ in errs] == [f"spec.layout.onDemand.profiles[{i}]" for i in bad]
    for (_, why), i in zip(errs, bad, strict=True):
        assert why == (f"unknown MIG profile {names[i]!r} for {model}; valid profiles: "
                       f"{', '.join(own)}")


def test_a_profile_of_any_candidate_model_is_enough() -> None:
    two = {"models": ["A30-24GB", "H100-80GB"]}
    assert spec_errors(on_demand({"profiles": ["2g.12gb", "3g.40gb"]}, gpus=two)) == []
    errs = spec_errors(on_demand({"profiles": ["3g.40gb", "3g.20gb"]}, gpus=two))
    assert [f for f, _ in errs] == ["spec.layout.onDemand.profiles[1]"]
    assert errs[0][1].startswith("'3g.20gb' is not a MIG profile of any model of "
                                 "spec.gpus.models")
    assert "A30-24GB: 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb" in errs[0][1]
    # no selector: any model tessera knows; 3g.20gb is the A100-40GB's
    assert spec_errors(on_demand({"profiles": ["3g.20gb", "3g.40gb"]})) == []
    errs = spec_errors(on_demand({"profiles": ["3g.30gb"]}))
    assert [f for f, _ in errs] == ["spec.layout.onDemand.profiles[0]"]
    assert "not a MIG profile of any GPU model tessera knows" in errs[0][1]


# -- admission: sharing, models --------------------------------------------------------------

def test_shares_is_refused_with_on_demand_only() -> None:
    errs = spec_errors(on_demand(None, sharing="Shares"))
    assert [f for f, _ in errs] == ["spec.sharing"]
    assert "Shares does not apply to migMode OnDemand" in errs[0][1]
    assert spec_errors(on_demand(None, sharing="Whole")) == []
    enabled = GPUPartitionSpec.model_validate({
        "nodeSelector": {}, "sharing": "Shares",
        "layout": {"profiles": [{"name": "1g.10gb", "count": 7}]}})
    assert spec_errors(enabled) == []


def test_all_errors_are_reported_at_once() -> None:
    errs = spec_errors(on_demand({"profiles": ["1g.6gb", "1g.10gb"], "maxInstances": 6},
                                 product("A30-24GB"), sharing="Shares"))
    assert [f for f, _ in errs] == ["spec.sharing", "spec.layout.onDemand.profiles[1]",
                                    "spec.layout.onDemand.maxInstances"]
    assert errs[2][1].startswith("6 instances of 1g.6gb never fit on one GPU: A30-24GB holds "
                                 "at most 4")


def test_unknown_product_label_names_the_known_models() -> None:
    errs = spec_errors(on_demand(None, product("L40S")))
    assert errs == [("spec.nodeSelector.matchLabels",
                     "unknown GPU model 'L40S'; known models: " + ", ".join(
                         m.id for m in MODELS))]


def test_a_model_without_mig_is_refused_for_on_demand(no_mig_model: str) -> None:
    errs = spec_errors(on_demand({"maxInstances": 2}, product(no_mig_model)))
    assert errs == [("spec.nodeSelector.matchLabels",
                     f"migMode OnDemand needs MIG; {no_mig_model} has none: select "
                     "MIG-capable GPUs or use migMode Disabled")]
    # the same GPUs shared whole, MIG disabled, are fine
    disabled = GPUPartitionSpec.model_validate(
        {"nodeSelector": product(no_mig_model), "layout": {"migMode": "Disabled"}})
    assert spec_errors(disabled) == []
    # and no selector never lands an OnDemand partition's check on it
    assert spec_errors(on_demand()) == []


# -- resolve: per node, per GPU --------------------------------------------------------------

def test_on_demand_claims_every_mig_gpu_and_reports_gpus_without_mig(
        no_mig_model: str) -> None:
    nodes = [node("h", "H100-80GB"), node("a", "A30-24GB"), node("l", no_mig_model, 1)]
    r = resolve([pv("p", on_demand())], nodes)["p"]
    assert r.selected == ["a", "h", "l"]
    assert {(c.node, c.index) for c in r.claims} == {("a", 0), ("a", 1), ("h", 0), ("h", 1)}
    assert [(pr.node, pr.reason, pr.message) for pr in r.problems] == [
        ("l", "LayoutDoesNotFit", f"GPU 0 ({no_mig_model}): migMode OnDemand needs MIG; "
         f"{no_mig_model} has none: select MIG-capable GPUs or use migMode Disabled")]
    # a declared layout on the same GPU says the same instead of failing on the model
    enabled = GPUPartitionSpec.model_validate(
        {"nodeSelector": {}, "layout": {"profiles": [{"name": "1g.10gb", "count": 1}]}})
    r = resolve([pv("e", enabled)], [node("l", no_mig_model, 1)])["e"]
    assert r.claims == [] and r.problems[0].reason == "LayoutDoesNotFit"
    assert "migMode Enabled needs MIG" in r.problems[0].message


def test_a_gpu_none_of_whose_profiles_are_allowed_does_not_fit() -> None:
    nodes = [node("h", "H100-80GB"), node("a", "A30-24GB")]
    r = resolve([pv("p", on_demand({"profiles": ["3g.40gb", "1g.10gb"]}))], nodes)["p"]
    assert {c.node for c in r.claims} == {"h"}
    assert [(pr.node, pr.reason) for pr in r.problems] == [("a", "LayoutDoesNotFit")] * 2
    assert r.problems[0].message == (
        "GPU 0 (A30-24GB): none of onDemand.profiles (3g.40gb, 1g.10gb) is a MIG profile of "
        "A30-24GB; its profiles: 1g.6gb, 1g.6gb+me, 2g.12gb, 2g.12gb+me, 4g.24gb")
    # one allowed profile the model has is enough; maxInstances above its limit is a bound
    r = resolve([pv("p", on_demand({"profiles": ["3g.40gb", "2g.12gb"], "maxInstances": 7}))],
                nodes)["p"]
    assert len(r.claims) == 4 and r.problems == []


def test_an_older_declared_layout_keeps_its_gpus_from_on_demand() -> None:
    enabled = GPUPartitionSpec.model_validate(
        {"nodeSelector": {}, "gpus": {"indices": [0]},
         "layout": {"profiles": [{"name": "7g.80gb", "count": 1}]}})
    out = resolve([pv("old", enabled), pv("new", on_demand(), "2026-01-02T00:00:00Z")],
                  [node("h", "H100-80GB")])
    assert [(c.index) for c in out["new"].claims] == [1]
    assert [(pr.reason, pr.message) for pr in out["new"].problems] == [
        ("GPUClaimed", "GPU 0 belongs to older gpupartition/old")]


def test_status_layout_says_mig_on_demand() -> None:
    for bounds, text in [(None, "MIG on demand"),
                         ({"maxInstances": 3}, "MIG on demand"),
                         ({"profiles": ["3g.40gb", "1g.10gb"]},
                          "MIG on demand (3g.40gb,1g.10gb)")]:
        p = pv("p", on_demand(bounds))
        status = aggregate(p, resolve([p], [node("h", "H100-80GB")])["p"], None)
        assert status.layout == text
