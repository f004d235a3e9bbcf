"""Live resize of a pod's DRA claims, the operator's rules (pure): which claim a container's
request resizes, what the new budget is, what the GPUQuota counts beyond the allocation (the
claim's holder holds the allocation), refusals that say what to do, and which pods the
leader labels so that their resizes are answered at all."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.claim_budget import ClaimBudget, claim_budgets_text, parse_claim_budgets
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_CLAIM_BUDGET,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
)
from tessera.api.resize import ResizeStatus, digest
from tessera_operator.controller.resize import of_claims, pod_need
from tessera_operator.quota.arith import (
    QuotaPolicy,
    Usage,
    claims_growth,
    pod_counts,
    pod_usage,
    recount,
)
from tessera_operator.quota.claim_resize import (
    ClaimResizePlan,
    allocated_share,
    claims_by_container,
    plan_claims,
)
from tessera_operator.quota.claims import PodRef, claim_users
from tessera_operator.quota.resize import ResizeError

NS = "team"
NODE = "gpu-node-1"
POD = "infer"
POD_UID = "5d3e9a10-0000-4000-8000-000000000001"
CLAIM = "infer-gpu-x7k2q"
CLAIM_UID = "0b6c77aa-0000-4000-8000-000000000002"
ALLOC = {"memory": "4Gi", "cores": "30"}
KEY = b"k" * 32


def result(device: str = "gpu0", request: str = "gpu", consumed: dict[str, str] | None = ALLOC,
           driver: str = DRA_DRIVER) -> dict[str, Any]:
    r: dict[str, Any] = {"request": request, "driver": driver, "pool": NODE, "device": device}
    if consumed is not None:
        r["consumedCapacity"] = dict(consumed)
    return r


def claim(name: str = CLAIM, uid: str = CLAIM_UID, results: list[dict[str, Any]] | None = None,
          owner: str | None = POD_UID, users: tuple[tuple[str, str], ...] = ((POD, POD_UID),),
          namespace: str = NS) -> dict[str, Any]:
    """A resource.k8s.io/v1 ResourceClaim as the API server holds it once allocated and
    reserved; ``owner``: the pod a ResourceClaimTemplate made it for (None: a named claim)."""
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": uid}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": POD,
                                    "uid": owner, "controller": True,
                                    "blockOwnerDeletion": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRA_DEVICE_CLASS,
                "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}}]}},
            "status": {"allocation": {"devices": {"results": [result()] if results is None
                                                  else results}},
                       "reservedFor": [{"resource": "pods", "name": n, "uid": u}
                                       for n, u in users]}}


def pod(containers: dict[str, list[str]] | None = None, generated: dict[str, str] | None = None,
        named: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        phase: str = "Running", init: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """A pod using DRA claims: ``generated``: its spec.resourceClaims entries from a template,
    with the claim each got; ``named``: entries naming a claim; ``containers``: the entries
    each container uses."""
    generated = {"gpu": CLAIM} if generated is None and named is None else generated or {}
    named = named or {}

    def c(name: str, uses: list[str]) -> dict[str, Any]:
        return {"name": name, "image": "vllm:latest",
                "resources": {"claims": [{"name": n} for n in uses]}}

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": NS, "name": POD, "uid": POD_UID,
                         "labels": {"tessera.dev/budgeted": "claims"},
                         "annotations": dict(annotations or {})},
            "spec": {"nodeName": NODE,
                     "resourceClaims": [{"name": k, "resourceClaimTemplateName": f"{k}-t"}
                                        for k in generated]
                     + [{"name": k, "resourceClaimName": v} for k, v in named.items()],
                     "initContainers": [c(n, u) for n, u in (init or {}).items()],
                     "containers": [c(n, u) for n, u in
                                    (containers or {"main": ["gpu"]}).items()]},
            "status": {"phase": phase, "resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in generated.items()]}}


def resize(request: dict[str, Any], current: dict[str, ClaimBudget] | None = None,
           claims: dict[str, dict[str, Any]] | None = None, p: dict[str, Any] | None = None,
           policy: QuotaPolicy | None = None) -> ClaimResizePlan:
    return plan_claims(p if p is not None else pod(), json.dumps(request),
                       claims if claims is not None else {CLAIM: claim()}, current or {},
                       policy or QuotaPolicy())


# -- which claims a container uses -------------------------------------------------------------


def test_containers_map_to_the_claims_they_use_generated_or_named() -> None:
    p = pod(containers={"main": ["gpu"], "side": ["gpu", "nic"], "log": []},
            generated={"gpu": CLAIM, "late": ""}, named={"nic": "shared-nic"},
            init={"warm": ["gpu"]})
    # "late": a template's claim not generated yet is left out
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": CLAIM}]
    p["spec"]["containers"][2]["resources"]["claims"] = [{"name": "late"}]
    assert claims_by_container(p) == {"warm": [CLAIM], "main": [CLAIM],
                                      "side": [CLAIM, "shared-nic"], "log": []}


# -- the claim as its allocation sized it ------------------------------------------------------


def test_the_allocation_is_what_the_scheduler_consumed_in_mib_rounded_up() -> None:
    assert allocated_share(claim(), POD_UID) == ClaimBudget(CLAIM, 4096, 30, 4096, 30)
    c = claim(results=[result(consumed={"memory": "1G", "cores": "100"})])
    assert allocated_share(c, POD_UID) == ClaimBudget(CLAIM, 954, 100, 954, 100)  # 953.67


@pytest.mark.parametrize(("c", "why"), [
    (claim(owner=None), "is not this pod's own .* give the pod a ResourceClaimTemplate "
                        "instead"),
    (claim(owner="another-pod-uid"), "not this pod's own"),
    (claim(results=[result(), result("gpu1", "second")]),
     f"has 2 devices of {DRA_DRIVER} allocated; only a claim of one device can be resized"),
    (claim(results=[]), f"has 0 devices of {DRA_DRIVER}"),
    (claim(results=[result(driver="nic.example.com")]), f"has 0 devices of {DRA_DRIVER}"),
    (claim(results=[result(consumed=None)]),
     "has device gpu0 whole .* DRAConsumableCapacity .* nothing to grow into"),
    (claim(results=[result(consumed={"memory": "4Gi"})]), "has device gpu0 whole"),
    (claim(results=[result(consumed={"memory": "lots", "cores": "30"})]), "cannot be read"),
    (claim(results=[result(consumed={"memory": "4Gi", "cores": "150"})]),
     "outside what a device has"),
    (claim(results=[result(consumed={"memory": "0", "cores": "30"})]),
     "outside what a device has"),
])
def test_a_claim_that_cannot_be_resized_says_why(c: dict[str, Any], why: str) -> None:
    with pytest.raises(ResizeError, match=why):
        allocated_share(c, POD_UID)


def test_an_owner_reference_that_is_not_the_controller_does_not_make_it_the_pods() -> None:
    c = claim()
    c["metadata"]["ownerReferences"][0]["controller"] = False
    with pytest.raises(ResizeError, match="not this pod's own"):
        allocated_share(c, POD_UID)


# -- the plan ----------------------------------------------------------------------------------


def test_growing_memory_and_cores_counts_the_difference() -> None:
    p = resize({"main": {"memory": "6Gi", "cores": 40}})
    assert p.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 6144, 40, 4096, 30)}
    assert p.grow == Usage(2048, 10) and p.shrink == Usage()


def test_what_a_request_leaves_out_stays_as_it_is_now() -> None:
    p = resize({"main": {"memory": "8Gi"}})
    assert p.budgets[CLAIM_UID] == ClaimBudget(CLAIM, 8192, 30, 4096, 30)
    assert p.grow == Usage(4096, 0)
    now = {CLAIM_UID: ClaimBudget(CLAIM, 8192, 30, 4096, 30)}
    p = resize({"main": {"cores": 50}}, now)
    assert p.budgets[CLAIM_UID] == ClaimBudget(CLAIM, 8192, 50, 4096, 30)
    assert p.grow == Usage(0, 20) and p.shrink == Usage()


def test_below_the_allocation_the_quota_counts_nothing_and_growing_again_only_beyond_it(
        ) -> None:
    """The claim's holder holds the allocation whatever the budget: shrinking under it gives
    the quota nothing back, and growing back up to it takes nothing from the quota."""
    shrunk = resize({"main": {"memory": "2Gi", "cores": 20}})
    assert shrunk.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 2048, 20, 4096, 30)}
    assert shrunk.grow == Usage() and shrunk.shrink == Usage()
    grown = resize({"main": {"memory": "6Gi", "cores": 40}}, shrunk.budgets)
    assert grown.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 6144, 40, 4096, 30)}
    assert grown.grow == Usage(2048, 10)  # not the 4Gi and 20 cores from 2Gi/20
    assert grown.shrink == Usage()


def test_a_budget_back_to_exactly_the_allocation_drops_out_of_the_annotation() -> None:
    now = {CLAIM_UID: ClaimBudget(CLAIM, 6144, 40, 4096, 30)}
    p = resize({"main": {"memory": "4Gi", "cores": 30}}, now)
    assert p.budgets == {}
    assert p.grow == Usage() and p.shrink == Usage(2048, 10)
    assert claim_budgets_text(p.budgets) == "{}"


def test_a_budget_of_an_earlier_allocation_is_not_carried_over() -> None:
    """The claim was allocated again (another size): what the annotation says of it was for
    the old allocation, so the request starts from the new one."""
    stale = {CLAIM_UID: ClaimBudget(CLAIM, 8192, 60, 2048, 10)}
    p = resize({"main": {"cores": 40}}, stale)
    assert p.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 4096, 40, 4096, 30)}


def test_other_claims_of_the_annotation_are_kept() -> None:
    other = {"other-uid": ClaimBudget("infer-gpu-2", 2048, 20, 1024, 10)}
    p = resize({"main": {"memory": "6Gi"}}, other)
    assert p.budgets == {**other, CLAIM_UID: ClaimBudget(CLAIM, 6144, 30, 4096, 30)}
    assert p.grow == Usage(2048, 0)  # the other claim's growth was counted already


def test_two_containers_sharing_one_claim_may_ask_for_the_same_size() -> None:
    p = resize({"main": {"memory": "6Gi", "cores": 40}, "side": {"memory": "6Gi", "cores": 40}},
               p=pod(containers={"main": ["gpu"], "side": ["gpu"]}))
    assert p.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 6144, 40, 4096, 30)}
    assert p.grow == Usage(2048, 10)  # one claim: counted once


def test_a_claim_used_by_an_init_container_is_resized_through_it() -> None:
    p = resize({"warm": {"cores": 50}}, p=pod(containers={"main": []}, init={"warm": ["gpu"]}))
    assert p.budgets == {CLAIM_UID: ClaimBudget(CLAIM, 4096, 50, 4096, 30)}


TWO_CLAIMS = {CLAIM: claim(), "infer-gpu-2": claim("infer-gpu-2", "uid-2")}

REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, dict[str, Any]], str]] = [
    ("a named claim, not the pod's own",
     pod(named={"gpu": "team-gpu"}), {"main": {"memory": "6Gi"}},
     {"team-gpu": claim("team-gpu", owner=None)},
     "ResourceClaim team-gpu is not this pod's own .* give the pod a ResourceClaimTemplate"),
    ("a claim of two tessera devices",
     pod(), {"main": {"memory": "6Gi"}},
     {CLAIM: claim(results=[result(), result("gpu1", "b")])},
     "has 2 devices of gpu.tessera.dev allocated; only a claim of one device"),
    ("a whole device: no consumed capacity",
     pod(), {"main": {"cores": 50}}, {CLAIM: claim(results=[result(consumed=None)])},
     "whole .* nothing to grow into"),
    ("a container using two claims of tessera's",
     pod(containers={"main": ["gpu", "gpu2"]}, generated={"gpu": CLAIM, "gpu2": "infer-gpu-2"}),
     {"main": {"memory": "6Gi"}}, TWO_CLAIMS,
     f"container 'main' uses 2 claims of {DRA_DRIVER} \\({CLAIM}, infer-gpu-2\\); a resize "
     "names one budget per container"),
    ("a container of the pod using no claim",
     pod(containers={"main": ["gpu"], "log": []}), {"log": {"memory": "6Gi"}},
     {CLAIM: claim()}, "container 'log' uses 0 claims"),
    ("a claim that is not tessera's",
     pod(), {"main": {"memory": "6Gi"}},
     {CLAIM: claim(results=[result(driver="nic.example.com")])}, "uses 0 claims"),
    ("a container the pod does not have",
     pod(), {"sidecar": {"memory": "6Gi"}}, {CLAIM: claim()},
     "the pod has no container 'sidecar'"),
    ("two containers sharing one claim, different sizes",
     pod(containers={"main": ["gpu"], "side": ["gpu"]}),
     {"main": {"memory": "6Gi", "cores": 40}, "side": {"memory": "8Gi", "cores": 40}},
     {CLAIM: claim()},
     f"containers 'main' and 'side' use the same claim {CLAIM} and ask for different sizes"),
    ("more than all the device's cores",
     pod(), {"main": {"cores": 101}}, {CLAIM: claim()},
     r"container 'main': cores must be 1\.\.100 \(percent of its device\), not 101"),
    ("no cores at all",
     pod(), {"main": {"cores": 0}}, {CLAIM: claim()}, r"cores must be 1\.\.100"),
    ("a request naming no container",
     pod(), {}, {CLAIM: claim()}, "must be a JSON object naming containers"),
]


@pytest.mark.parametrize(("p", "request_", "claims", "why"), [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_refusals_say_what_to_do(p: dict[str, Any], request_: dict[str, Any],
                                 claims: dict[str, dict[str, Any]], why: str) -> None:
    with pytest.raises(ResizeError, match=why):
        resize(request_, claims=claims, p=p)


def test_the_per_pod_max_of_the_quota_bounds_each_claims_new_budget() -> None:
    policy = QuotaPolicy(quota="team", max_memory_mib=16384, max_cores=50)
    assert resize({"main": {"memory": "16Gi", "cores": 50}}, policy=policy).grow == Usage(
        12288, 20)
    with pytest.raises(ResizeError, match=f'claim {CLAIM} would hold 16385Mi GPU memory, over '
                                          'the per-pod GPUQuota "team" max 16Gi'):
        resize({"main": {"memory": "16385Mi"}}, policy=policy)
    with pytest.raises(ResizeError, match=f'claim {CLAIM} would hold 51 cores, over the '
                                          'per-pod GPUQuota "team" max 50'):
        resize({"main": {"cores": 51}}, policy=policy)


def test_a_budget_kept_by_a_request_is_checked_against_the_max_too() -> None:
    """A max lowered since the claim grew: resizing only the cores still checks the memory
    the budget keeps."""
    now = {CLAIM_UID: ClaimBudget(CLAIM, 20480, 30, 4096, 30)}
    with pytest.raises(ResizeError, match="would hold 20Gi GPU memory"):
        resize({"main": {"cores": 40}}, now, policy=QuotaPolicy(quota="team",
                                                                max_memory_mib=16384))


asks = st.tuples(st.one_of(st.none(), st.integers(1, 81559)),
                 st.one_of(st.none(), st.integers(1, 100)))


@settings(max_examples=200, deadline=None)
@given(alloc_mib=st.integers(1, 40960), alloc_cores=st.integers(1, 100),
       steps=st.lists(asks.filter(lambda a: a != (None, None)), min_size=1, max_size=6))
def test_over_any_sequence_of_resizes_the_quota_counts_exactly_the_growth(
        alloc_mib: int, alloc_cores: int, steps: list[tuple[int | None, int | None]]) -> None:
    """What grew minus what shrank, summed over every approved resize, is what the
    annotation's budgets hold beyond the allocation: the quota never drifts, and what it
    counts for the claim never includes the allocation (the claim's holder holds that)."""
    c = claim(results=[result(consumed={"memory": f"{alloc_mib}Mi",
                                        "cores": str(alloc_cores)})])
    current: dict[str, ClaimBudget] = {}
    counted = Usage()
    for mem, cores in steps:
        ask: dict[str, Any] = {}
        if mem is not None:
            ask["memory"] = f"{mem}Mi"
        if cores is not None:
            ask["cores"] = cores
        p = resize({"main": ask}, current, {CLAIM: c})
        assert min(p.grow.memory_mib, p.shrink.memory_mib) == 0
        assert min(p.grow.cores, p.shrink.cores) == 0
        counted = Usage(counted.memory_mib + p.grow.memory_mib - p.shrink.memory_mib,
                        counted.cores + p.grow.cores - p.shrink.cores)
        current = parse_claim_budgets(claim_budgets_text(p.budgets))  # as written, read back
        b = current.get(CLAIM_UID, ClaimBudget(CLAIM, alloc_mib, alloc_cores, alloc_mib,
                                               alloc_cores))
        if mem is not None:
            assert b.memory_mib == mem
        if cores is not None:
            assert b.cores == cores
        if CLAIM_UID in current:  # only a budget other than the allocation is written
            assert (b.memory_mib, b.cores) != (alloc_mib, alloc_cores)
    assert counted == claims_growth(current)


# -- what the GPUQuota counts for a pod of claims ----------------------------------------------


def budgets_text(*budgets: tuple[str, ClaimBudget]) -> str:
    return claim_budgets_text(dict(budgets))


GROWN_TWO = budgets_text((CLAIM_UID, ClaimBudget(CLAIM, 6144, 40, 4096, 30)),
                         ("uid-2", ClaimBudget("infer-gpu-2", 1024, 60, 2048, 10)))


def test_the_growth_of_a_pods_claims_is_the_sum_beyond_each_allocation() -> None:
    budgets = parse_claim_budgets(GROWN_TWO)
    # the first grew 2Gi and 10 cores; the second shrank memory (nothing) and grew 50 cores
    assert claims_growth(budgets) == Usage(2048, 60)
    assert claims_growth({}) == Usage()


@pytest.mark.parametrize(("annotations", "phase", "counts", "usage"), [
    ({ANNOTATION_CLAIM_BUDGET: GROWN_TWO}, "Running", True, Usage(2048, 60)),
    ({ANNOTATION_CLAIM_BUDGET: GROWN_TWO}, "Pending", True, Usage(2048, 60)),
    ({ANNOTATION_CLAIM_BUDGET: GROWN_TWO}, "Succeeded", False, Usage(2048, 60)),
    ({ANNOTATION_CLAIM_BUDGET: GROWN_TWO}, "Failed", False, Usage(2048, 60)),
    # a growth taken back: the claims are at their allocations, held by their holders
    ({ANNOTATION_CLAIM_BUDGET: "{}"}, "Running", True, Usage()),
    # never resized: nothing beyond its claims' holders
    ({}, "Running", False, Usage()),
    # an annotation that cannot be read counts nothing rather than failing the count
    ({ANNOTATION_CLAIM_BUDGET: '{"u": {"claim": "c", "cores": 400}}'}, "Running", True,
     Usage()),
])
def test_a_pod_of_claims_counts_its_growth_while_it_runs(annotations: dict[str, str], phase: str,
                                                          counts: bool, usage: Usage) -> None:
    p = pod(annotations=annotations, phase=phase)
    assert of_claims(p)
    assert pod_counts(p) is counts
    assert pod_usage(p) == usage


def test_a_namespace_recount_adds_the_growth_of_its_running_claim_pods() -> None:
    running = pod(annotations={ANNOTATION_CLAIM_BUDGET: GROWN_TWO})
    done = pod(annotations={ANNOTATION_CLAIM_BUDGET: GROWN_TWO}, phase="Succeeded")
    plain = pod()
    assert recount([running, done, plain]) == Usage(2048, 60)


def test_a_device_plugin_pod_is_not_a_pod_of_claims() -> None:
    p = pod(annotations={ANNOTATION_BUDGET: "{}"})
    assert not of_claims(p)


# -- what the pod's growth holders must hold ---------------------------------------------------


def sealed(previous: str, state: str = "Approved", key: bytes = KEY,
           uid: str = POD_UID) -> str:
    s = ResizeStatus(digest('{"main": {"memory": "2Gi"}}'), state,  # type: ignore[arg-type]
                     previous=previous, grow={"memoryMiB": 0, "cores": 0})
    return s.sealed(key, uid).to_annotation()


BEFORE = budgets_text((CLAIM_UID, ClaimBudget(CLAIM, 8192, 30, 4096, 30)))  # growth 4Gi, 0
AFTER = budgets_text((CLAIM_UID, ClaimBudget(CLAIM, 6144, 40, 4096, 30)))  # growth 2Gi, 10


@pytest.mark.parametrize(("resize_status", "want"), [
    # nothing waits: the growth the annotation holds
    (None, Usage(2048, 10)),
    # approved, not applied by the node yet: the node may refuse and bring back BEFORE, so
    # the larger of each resource is held meanwhile
    (sealed(BEFORE), Usage(4096, 10)),
    (sealed(BEFORE, "Refused"), Usage(4096, 10)),
    # applied: only what it holds now
    (sealed(BEFORE, "Applied"), Usage(2048, 10)),
    # a record the operator did not seal for this pod is not believed
    (sealed(BEFORE, key=b"j" * 32), Usage(2048, 10)),
    (sealed(BEFORE, uid="another-pod"), Usage(2048, 10)),
    # a previous that cannot be read: only what it holds now
    (sealed("{broken"), Usage(2048, 10)),
    # the first resize of the pod: previous is "no budget", i.e. the allocations
    (sealed("{}"), Usage(2048, 10)),
])
def test_a_pod_of_claims_needs_its_growth_held_and_while_a_resize_waits_the_larger(
        resize_status: str | None, want: Usage) -> None:
    ann = {ANNOTATION_CLAIM_BUDGET: AFTER}
    if resize_status is not None:
        ann[ANNOTATION_BUDGET_RESIZE] = resize_status
    assert pod_need(pod(annotations=ann), KEY) == want


def test_a_finished_or_never_resized_pod_of_claims_needs_nothing_held() -> None:
    ann = {ANNOTATION_CLAIM_BUDGET: AFTER, ANNOTATION_BUDGET_RESIZE: sealed(BEFORE)}
    assert pod_need(pod(annotations=ann, phase="Succeeded"), KEY) == Usage()
    assert pod_need(pod(), KEY) == Usage()


# -- the pods the leader labels ----------------------------------------------------------------


def test_claim_users_are_the_pods_tessera_claims_are_reserved_for_each_once() -> None:
    other_driver = claim("nic", "uid-nic", results=[result(driver="nic.example.com")],
                         users=(("web", "uid-web"),))
    unallocated = claim("pending", "uid-p", users=(("queued", "uid-q"),))
    del unallocated["status"]["allocation"]
    shared = claim("team-gpu", "uid-shared", owner=None,
                   users=(("b-pod", "uid-b"), ("a-pod", "uid-a")))
    shared["status"]["reservedFor"] += [
        {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "uid-job"},
        {"resource": "services", "name": "svc", "uid": "uid-svc"},  # core, but not a pod
        {"resource": "pods", "name": "no-uid"},
    ]
    second_of_infer = claim("infer-gpu-2", "uid-2")  # the same pod again: listed once
    elsewhere = claim("x", "uid-x", namespace="alpha", users=(("z-pod", "uid-z"),))
    got = claim_users([other_driver, unallocated, claim(), shared, second_of_infer, elsewhere])
    assert got == [PodRef("alpha", "z-pod", "uid-z"), PodRef(NS, "a-pod", "uid-a"),
                   PodRef(NS, "b-pod", "uid-b"), PodRef(NS, POD, POD_UID)]
    assert claim_users([]) == []
