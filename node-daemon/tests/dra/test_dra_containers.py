"""A prepared claim is one container to the core controllers and the audit: its budget file
and ledger, the pods of this node that use it (a shared claim's several pods, a template's
generated claim), its GPUQuota's weight and lending. A claim with a core budget gets a
controller; a process of any pod that uses the claim is the claim's, never foreign."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import DRA_DRIVER, VGPU
from tessera_node.audit.logic import AuditedContainer, ContainerKey, GPUProcess, audit
from tessera_node.cores.runner import plan
from tessera_node.device.cgroups import CgroupOwner
from tessera_node.dra.checkpoint import Checkpoint, PreparedClaim
from tessera_node.dra.claims import ClaimError, Result, UnitBudget
from tessera_node.dra.containers import (
    ClaimPolicy,
    ClaimUser,
    claim_containers,
    claim_policy,
    users_by_claim,
)

NS = "team-a"
G0 = "GPU-00000000-1111-2222-3333-444444444444"
M14 = "MIG-00010004-1111-2222-3333-444444444444"
G1 = "GPU-00000001-1111-2222-3333-444444444444"
GIB = 1 << 30


def pod(name: str, uid: str, claims: list[dict[str, str]], containers: dict[str, list[str]],
        generated: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid},
            "spec": {"resourceClaims": claims,
                     "containers": [{"name": c, "resources": {"claims": [{"name": n}
                                                                       for n in names]}}
                                    for c, names in containers.items()]},
            "status": {"phase": phase, "resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in (generated or {}).items()]}}


def prepared(uid: str, name: str, *units: UnitBudget, quota: str | None = None,
             weight: int = 1, lending: bool = True) -> PreparedClaim:
    return PreparedClaim(uid, NS, name, (Result("gpu", "node-a", "gpu0"),), units, quota,
                         weight, lending)


def files(uid: str) -> tuple[str, str]:
    return f"/state/claims/{uid}/budget", f"/state/claims/{uid}/run"


def test_a_shared_claim_is_used_by_every_pod_that_names_it_running_ones_first() -> None:
    pods = [
        pod("b-ended", "u-b", [{"name": "g", "resourceClaimName": "shared"}], {"m": ["g"]},
            phase="Succeeded"),
        pod("c", "u-c", [{"name": "g", "resourceClaimName": "shared"}], {"m": ["g"]}),
        pod("a", "u-a", [{"name": "gpu", "resourceClaimName": "shared"}],
            {"main": ["gpu"], "side": ["gpu"], "other": []}),
    ]
    users = users_by_claim(pods)
    assert [(u.pod, u.containers, u.running) for u in users[(NS, "shared")]] == [
        ("a", ("main", "side"), True), ("c", ("m",), True), ("b-ended", ("m",), False)]


def test_a_templates_claim_is_found_by_the_name_the_pods_status_records() -> None:
    p = pod("w", "u-w", [{"name": "gpu", "resourceClaimTemplateName": "tpl"},
                         {"name": "later", "resourceClaimTemplateName": "tpl"}],
            {"main": ["gpu", "later"]}, generated={"gpu": "w-gpu-x7k2p"})
    users = users_by_claim([p])
    # "later" has no generated claim yet: nothing is guessed for it
    assert users == {(NS, "w-gpu-x7k2p"): [ClaimUser("u-w", "w", ("main",), True)]}


def test_a_claim_with_a_core_budget_is_controlled_with_its_quotas_weight() -> None:
    claim = prepared("c-1", "share", UnitBudget(G0, 4 * GIB, 30), quota=f"{NS}/team",
                     weight=3, lending=False)
    users = users_by_claim([pod("a", "u-a", [{"name": "g", "resourceClaimName": "share"}],
                                {"main": ["g"]})])
    (c,) = claim_containers([claim], users, {}, files)
    assert (c.key, c.pod_uid, c.pod, c.container, c.claim) == (
        "c-1", "u-a", "a", "main", f"{NS}/share")
    assert (c.resource, c.budget_file, c.ledger_dir) == (
        VGPU, "/state/claims/c-1/budget", "/state/claims/c-1/run")
    assert c.budget is not None and (c.budget.memory_bytes, c.budget.cores) == (4 * GIB, 30)
    (spec,) = plan([c], {G0: 0})[G0]
    assert (spec.name, spec.entry, spec.weight, spec.lend) == ("c-1", 0, 3.0, False)
    assert (spec.owner.pod, spec.owner.quota) == ("a", "team")


def test_a_whole_instance_without_cores_gets_no_controller() -> None:
    claim = prepared("c-2", "whole", UnitBudget(M14, None, None))
    (c,) = claim_containers([claim], {}, {M14: G1}, files)
    assert c.resource == DRA_DRIVER and c.gpus == (G1,)
    assert c.pod_uid == "" and c.container == "whole"  # no pod seen yet: named by the claim
    assert plan([c], {M14: 1}) == {}


@given(st.lists(st.sampled_from(["u-a", "u-b", "u-c", "u-x"]), min_size=1, max_size=6))
def test_a_process_of_any_pod_using_the_claim_is_the_claims(owners: list[str]) -> None:
    users = [ClaimUser("u-a", "a", ("m",), True), ClaimUser("u-b", "b", ("m",), True),
             ClaimUser("u-c", "c", ("m",), False)]
    (c,) = claim_containers([prepared("c-3", "shared", UnitBudget(G0, GIB, 50))],
                            {(NS, "shared"): users}, {}, files)
    audited = AuditedContainer(ContainerKey(NS, c.pod, c.container), c.pod_uid, None,
                               {G0: GIB}, other_pod_uids=frozenset(c.other_pod_uids))
    procs = [GPUProcess(pid=100 + i, unit=G0, used_bytes=1 << 20,
                        owner=CgroupOwner(uid, None)) for i, uid in enumerate(owners)]
    result = audit([audited], procs)
    assert [p.owner.pod_uid for p in result.foreign if p.owner] == [
        u for u in owners if u == "u-x"]
    assert result.usage[(audited.key, G0)] == (1 << 20) * sum(u != "u-x" for u in owners)


def quota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS}, "spec": spec}


@pytest.mark.parametrize(("quotas", "want"), [
    ([], ClaimPolicy()),
    ([quota("b", {"hard": {"pods": 3}}), quota("a", {"hard": {"cores": 100}})],
     ClaimPolicy(f"{NS}/a")),
    ([quota("a", {"hard": {"pods": 3}}), quota("z", {"weight": 4, "lending": False})],
     ClaimPolicy(f"{NS}/z", 4, False)),
    ([quota("z", {"lending": False})], ClaimPolicy(f"{NS}/z", 1, False)),
    ([quota("z", {"weight": 7})], ClaimPolicy(f"{NS}/z", 7, True)),
])
def test_the_policy_is_the_namespaces_gpuquotas(quotas: list[dict[str, Any]],
                                                want: ClaimPolicy) -> None:
    assert claim_policy(NS, quotas) == want


def test_a_gpuquota_that_cannot_be_read_fails_the_claim_rather_than_guess() -> None:
    with pytest.raises(ClaimError, match=rf"GPUQuota {NS}/bad: its spec cannot be read"):
        claim_policy(NS, [quota("bad", {"weight": "heavy"})])


def test_the_policy_survives_a_restart_in_the_checkpoint(tmp_path: Any) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json")
    cp.put(prepared("c-4", "share", UnitBudget(G0, GIB, 20), quota=f"{NS}/team", weight=5,
                    lending=False))
    (again,) = Checkpoint(tmp_path / "checkpoint.json").claims()
    assert (again.quota, again.weight, again.lending) == (f"{NS}/team", 5, False)
