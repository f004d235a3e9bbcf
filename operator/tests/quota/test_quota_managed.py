"""The ResourceQuota a GPUQuota manages: name, hard, growth record, drift, lowering."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import ANNOTATION_RESIZE_GROWTH
from tessera.quota import managed
from tessera.quota.arith import Limits, Usage
from tessera.quota.objects import readable_limits

MEM, CORES = "requests.tessera.dev/vgpu-memory", "requests.tessera.dev/vgpu-cores"


def gpuquota(name: str = "team") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": "u-1"}}


def test_hard_maps_every_limit_and_an_unreadable_spec_admits_nothing() -> None:
    limits = Limits(40960, 400, 10, {"1g.10gb": 4})
    assert managed.hard_of(limits) == {MEM: "40960", CORES: "400",
                                       "requests.tessera.dev/mig-1g.10gb": "4"}
    # pods has no ResourceQuota counterpart (a ResourceQuota counts every pod)
    assert managed.hard_of(Limits(pods=3)) == {}
    assert managed.hard_of(None) == {MEM: "0", CORES: "0"}
    # growth lowers memory and cores, never below zero
    assert managed.hard_of(Limits(1000, 100), Usage(300, 150)) == {MEM: "700", CORES: "0"}


def test_the_name_names_the_gpuquota_and_stays_a_valid_name() -> None:
    assert managed.managed_name("team") == "gpuquota-team"
    long = managed.managed_name("x" * 253)
    assert len(long) == 253 and long != managed.managed_name("x" * 252 + "y")


def test_desired_is_owned_labelled_and_carries_the_growth() -> None:
    want = managed.desired(gpuquota(), Limits(4096, 100), {"p1": Usage(1024, 10)})
    meta = want["metadata"]
    assert meta["name"] == "gpuquota-team" and meta["namespace"] == "ns"
    assert meta["labels"]["tessera.dev/gpuquota"] == "team"
    assert meta["ownerReferences"] == [{
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota", "name": "team",
        "uid": "u-1", "controller": True, "blockOwnerDeletion": False}]
    assert want["spec"]["hard"] == {MEM: "3072", CORES: "90"}
    assert managed.growth_of(want) == {"p1": Usage(1024, 10)}


def test_drift_sets_back_hard_scopes_owner_and_record_and_nothing_when_equal() -> None:
    want = managed.desired(gpuquota(), Limits(4096, 100), {})
    assert managed.drift(want, want) is None
    # the API server writes quantities its own way: equal values are no drift
    same = {**want, "spec": {"hard": {MEM: "4Ki", CORES: "100"}}}
    assert managed.drift(same, want) is None
    edited = {"metadata": {"name": "gpuquota-team", "labels": {"other": "x"},
                           "annotations": {ANNOTATION_RESIZE_GROWTH: '{"p":{"cores":5}}'}},
              "spec": {"hard": {MEM: "9999", "pods": "3"}, "scopes": ["BestEffort"]}}
    patch = managed.drift(edited, want)
    assert patch is not None
    assert patch["spec"] == {"hard": {"pods": None, MEM: "4096", CORES: "100"},
                             "scopes": None, "scopeSelector": None}
    assert patch["metadata"]["labels"]["tessera.dev/gpuquota"] == "team"
    assert patch["metadata"]["annotations"] == {ANNOTATION_RESIZE_GROWTH: "{}"}
    assert patch["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_a_record_that_cannot_be_read_is_no_growth() -> None:
    for raw in ("not json", "[1]", '{"p": 3}', '{"p": {"cores": "x"}}'):
        rq = {"metadata": {"annotations": {ANNOTATION_RESIZE_GROWTH: raw}}}
        assert managed.growth_of(rq) == {}, raw
    # a pod shrunk back keeps its zero entry while it runs
    rq = {"metadata": {"annotations": {ANNOTATION_RESIZE_GROWTH: managed.growth_annotation(
        {"p": Usage()})}}}
    assert managed.growth_of(rq) == {"p": Usage()}


def test_lowering_is_refused_only_by_what_is_in_use_beyond_it() -> None:
    rq = {"status": {"used": {MEM: "3072", CORES: "30"}}}
    assert managed.lowered_fits(rq, {MEM: "3072", CORES: "40"}) == []
    assert managed.lowered_fits(rq, {MEM: "2048", CORES: "40"}) == [
        f"{MEM} used 3072, hard would be 2048"]
    assert managed.lowered_fits({"status": {"used": {MEM: "lots"}}}, {MEM: "1"}) == [
        f"{MEM} used cannot be read"]


usages = st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**4))


@given(st.dictionaries(st.text(min_size=1, max_size=8), usages, max_size=6))
def test_the_growth_record_round_trips(record: dict[str, Usage]) -> None:
    rq = {"metadata": {"annotations": {
        ANNOTATION_RESIZE_GROWTH: managed.growth_annotation(record)}}}
    assert managed.growth_of(rq) == record


@given(st.integers(0, 10**6), st.integers(0, 10**4),
       st.lists(st.tuples(usages, usages), max_size=6))
def test_limits_plus_growth_under_the_lowered_hard_is_live_usage_under_the_gpuquotas(
        hard_mem: int, hard_cores: int, pods: list[tuple[Usage, Usage]]) -> None:
    """What the ResourceQuota admits (the pods' limits within its lowered hard) is exactly
    what the GPUQuota allows for their live budgets (limits + growth within hard)."""
    asked = [a for a, _ in pods]
    live = [a + g for a, g in pods]
    record = {str(i): managed.grown(lv, a)
              for i, (a, lv) in enumerate(zip(asked, live, strict=True))}
    hard = managed.hard_of(Limits(hard_mem, hard_cores), managed.total_growth(record))
    limits_total = sum(a.memory_mib for a in asked), sum(a.cores for a in asked)
    live_total = sum(x.memory_mib for x in live), sum(x.cores for x in live)
    rq_admits = (limits_total[0] <= int(hard[MEM]) and limits_total[1] <= int(hard[CORES]))
    grown_total = managed.total_growth(record)
    fits_hard = (grown_total.memory_mib <= hard_mem and grown_total.cores <= hard_cores)
    gpuquota_admits = live_total[0] <= hard_mem and live_total[1] <= hard_cores
    assert (rq_admits and fits_hard) == gpuquota_admits


def test_a_quota_whose_hard_cannot_be_read_has_no_limits_so_its_managed_quota_admits_nothing(
        ) -> None:
    bad = {**gpuquota(), "spec": {"hard": {"memory": "lots", "cores": 100}}}
    assert readable_limits(bad) is None
    assert managed.hard_of(readable_limits(bad)) == managed.hard_of(None)
    good = {**gpuquota(), "spec": {"hard": {"memory": "4Gi", "cores": 100}}}
    assert readable_limits(good) == Limits(memory_mib=4096, cores=100)
