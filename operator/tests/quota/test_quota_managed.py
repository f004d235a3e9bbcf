"""The ResourceQuota a GPUQuota manages: name and label of any length, hard, drift, and when
it counts for its GPUQuota."""

from __future__ import annotations

import copy
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tessera_operator.quota import managed
from tessera_operator.quota.arith import Limits
from tessera_operator.quota.objects import view_of

MEM, CORES = "requests.tessera.dev/vgpu-memory", "requests.tessera.dev/vgpu-cores"
PODS = "requests.tessera.dev/pod"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def gpuquota(name: str = "team", uid: str = "u-1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}}


def test_hard_maps_every_limit_and_an_unreadable_spec_admits_nothing() -> None:
    limits = Limits(40960, 400, 10, {"1g.10gb": 4})
    assert managed.hard_of(limits) == {MEM: "40960", CORES: "400", PODS: "10",
                                       "requests.tessera.dev/mig-1g.10gb": "4"}
    # pods: every GPU pod carries one tessera.dev/pod (the webhook writes it)
    assert managed.hard_of(Limits(pods=3)) == {PODS: "3"}
    assert managed.hard_of(None) == {MEM: "0", CORES: "0", PODS: "0"}


def test_the_name_names_the_gpuquota_and_stays_a_valid_name() -> None:
    assert managed.managed_name("team") == "gpuquota-team"
    long = managed.managed_name("x" * 253)
    assert len(long) == 253 and long != managed.managed_name("x" * 252 + "y")


names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", fullmatch=True)


@given(names, names)
def test_any_valid_gpuquota_name_gets_a_valid_unique_name_and_label(a: str, b: str) -> None:
    """A GPUQuota name is a DNS subdomain of up to 253 characters; its ResourceQuota's name
    (a DNS subdomain too) and its label value (at most 63) stay valid and tell two quotas
    apart (the label of a 64-253 character name was refused by the API server)."""
    for n in (a, b):
        assert len(managed.managed_name(n)) <= 253 and DNS_SUBDOMAIN.match(
            managed.managed_name(n))
        assert len(managed.label_value(n)) <= 63 and LABEL_VALUE.match(managed.label_value(n))
    if a != b:
        assert managed.managed_name(a) != managed.managed_name(b)
        assert managed.label_value(a) != managed.label_value(b)


def test_desired_is_owned_labelled_and_names_its_gpuquota() -> None:
    long = "q" * 100
    want = managed.desired(gpuquota(long), Limits(4096, 100))
    meta = want["metadata"]
    assert meta["name"] == "gpuquota-" + long and meta["namespace"] == "ns"
    assert meta["labels"]["tessera.dev/gpuquota"] == managed.label_value(long)
    assert meta["annotations"] == {"tessera.dev/gpuquota-name": long}
    assert meta["ownerReferences"] == [{
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota", "name": long,
        "uid": "u-1", "controller": True, "blockOwnerDeletion": False}]
    assert meta["finalizers"] == ["tessera.dev/managed-quota"]  # a delete cannot lapse it
    assert want["spec"]["hard"] == {MEM: "4096", CORES: "100"}


def test_drift_sets_back_hard_scopes_owner_label_and_old_keys_and_nothing_when_equal() -> None:
    want = managed.desired(gpuquota(), Limits(4096, 100))
    assert managed.drift(want, want) is None
    # the API server writes quantities its own way: equal values are no drift
    same = {**want, "spec": {"hard": {MEM: "4Ki", CORES: "100"}}}
    assert managed.drift(same, want) is None
    edited = {"metadata": {"name": "gpuquota-team", "labels": {"other": "x"},
                           "annotations": {"tessera.dev/resize-growth": "{}", "mine": "1"}},
              "spec": {"hard": {MEM: "9999", "pods": "3"}, "scopes": ["BestEffort"]}}
    patch = managed.drift(edited, want)
    assert patch is not None
    assert patch["spec"] == {"hard": {"pods": None, MEM: "4096", CORES: "100"},
                             "scopes": None, "scopeSelector": None}
    assert patch["metadata"]["labels"]["tessera.dev/gpuquota"] == "team"
    # an earlier version's growth record goes; someone's own annotation stays
    assert patch["metadata"]["annotations"] == {"tessera.dev/resize-growth": None,
                                                "tessera.dev/gpuquota-name": "team"}
    assert patch["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # one made by an earlier version gets the finalizer beside anyone else's
    assert patch["metadata"]["finalizers"] == ["tessera.dev/managed-quota"]
    theirs = copy.deepcopy(want)
    theirs["metadata"]["finalizers"] = ["example.com/keep"]
    assert (managed.drift(theirs, want) or {})["metadata"]["finalizers"] == [
        "example.com/keep", "tessera.dev/managed-quota"]
    # none is added to one being deleted (the API server forbids it): it goes, and comes back
    theirs["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert "finalizers" not in ((managed.drift(theirs, want) or {}).get("metadata") or {})


def synced(rq: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(rq)
    out["status"] = {"hard": dict(rq["spec"]["hard"])}
    return out


def test_a_managed_quota_counts_only_while_it_is_there_ours_and_no_looser() -> None:
    q, limits = gpuquota(), Limits(4096, 100, 5)
    ours = managed.desired(q, limits)
    assert managed.enforcement(q, limits, ours) is None  # not synced yet: refuses all itself
    assert managed.enforcement(q, limits, synced(ours)) is None
    reason, why = managed.enforcement(q, limits, None) or ("", "")
    assert reason == managed.MISSING and "gpuquota-team does not exist" in why
    # someone else's ResourceQuota by that name (or an old GPUQuota's): not adopted
    other = managed.desired(gpuquota(uid="u-2"), limits)
    reason, why = managed.enforcement(q, limits, other) or ("", "")
    assert reason == managed.FOREIGN and "delete or rename it" in why
    # a raised limit (spec or status) or one removed: no longer the GPUQuota's count
    raised = synced(ours)
    raised["status"]["hard"][MEM] = "8192"
    reason, why = managed.enforcement(q, limits, raised) or ("", "")
    assert reason == managed.DRIFTED and MEM in why
    dropped = synced(ours)
    del dropped["spec"]["hard"][PODS]
    assert (managed.enforcement(q, limits, dropped) or ("",))[0] == managed.DRIFTED
    # tighter is fine: the API server enforces the smaller (a raise on its way)
    lowered = synced(ours)
    lowered["status"]["hard"][MEM] = "1024"
    assert managed.enforcement(q, limits, lowered) is None
    # deleted while tessera's finalizer holds it: it stays, and the API server counts with it
    deleting = {**synced(ours), "metadata": {**ours["metadata"], "resourceVersion": "7",
                                             "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert managed.enforcement(q, limits, deleting) is None
    # deleted with nothing holding it (made before the finalizer): about to be gone
    loose = copy.deepcopy(deleting)
    loose["metadata"]["finalizers"] = ["example.com/keep"]
    assert (managed.enforcement(q, limits, loose) or ("",))[0] == managed.MISSING
    # let go once its GPUQuota is gone: only tessera's finalizer leaves, at the version read
    assert managed.release(deleting) == {"metadata": {"resourceVersion": "7",
                                                      "finalizers": []}}
    assert managed.release(loose) is None and managed.release(synced(ours)) is None
    assert managed.quota_of(ours) == "team"
    # the uninstall hook takes it off whether deleted or not: only tessera's, at the version
    rq = {"metadata": {"resourceVersion": "9",
                       "finalizers": ["example.com/keep", "tessera.dev/managed-quota"]}}
    assert managed.finalizer_off(rq) == {"metadata": {"resourceVersion": "9",
                                                      "finalizers": ["example.com/keep"]}}
    assert managed.finalizer_off({"metadata": {"finalizers": ["example.com/keep"]}}) is None
    assert managed.finalizer_off({"metadata": {}}) is None


def test_a_quota_whose_hard_cannot_be_read_has_no_limits_so_its_managed_quota_admits_nothing(
        ) -> None:
    bad = {**gpuquota(), "spec": {"hard": {"memory": "lots", "cores": 100}}}
    assert view_of(bad).readable_limits is None
    assert managed.hard_of(view_of(bad).readable_limits) == managed.hard_of(None)
    good = {**gpuquota(), "spec": {"hard": {"memory": "4Gi", "cores": 100}}}
    assert view_of(good).readable_limits == Limits(memory_mib=4096, cores=100)
