"""Live resize rules (pure): the new budget, what grows and shrinks, refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.resize import ResizeStatus, digest
from tessera_operator.quota.arith import QuotaPolicy, Usage, usage_of
from tessera_operator.quota.resize import ResizeError, parse_request, plan

GIB_MIB = 1024


def budget(mem_mib: int = 4096, cores: int = 30, shares: int = 1) -> BudgetAnnotation:
    return BudgetAnnotation(quota="team", containers={
        "main": PerShareBudget.from_totals(shares, mem_mib, cores),
        "side": PerShareBudget.from_totals(1, 1024, 10)})


def test_grow_and_shrink() -> None:
    p = plan(budget(), json.dumps({"main": {"memory": "6Gi", "cores": 20}}), QuotaPolicy())
    assert p.grow == Usage(2048, 0) and p.shrink == Usage(0, 10)
    main = p.budget.containers["main"]
    assert main.memory_bytes == 6 << 30 and main.cores == 20
    assert p.budget.containers["side"] == budget().containers["side"]
    assert p.budget.quota == "team"


def test_totals_split_over_shares() -> None:
    p = plan(budget(8192, 100, shares=2), '{"main": {"cores": 150}}', QuotaPolicy())
    assert p.budget.containers["main"].cores == 75
    assert p.budget.containers["main"].memory_bytes == 4 << 30  # unchanged
    assert p.grow == Usage(0, 50)


@pytest.mark.parametrize("req, why", [
    ("nope", "not JSON"),
    ("[]", "JSON object naming containers"),
    ('{"main": {"memory": "12Qi"}}', "not a quantity"),
    ('{"main": {"memory": "0"}}', "memory must be positive"),
    ('{"main": {"cores": -1}}', "cores must be a whole number"),
    ('{"main": {"cores": 1.5}}', "cores must be a whole number"),
    ('{"main": {"gpus": 2}}', "memory and/or cores"),
    ('{"other": {"cores": 10}}', "holds no GPU share"),
    ('{"main": {"cores": 101}}', "exceed its 1 share(s)"),
])
def test_bad_requests_say_why(req: str, why: str) -> None:
    with pytest.raises(ResizeError, match=why.replace("(", r"\(").replace(")", r"\)")):
        plan(budget(), req, QuotaPolicy())


def test_per_pod_max_is_checked_on_the_whole_new_budget() -> None:
    policy = QuotaPolicy(quota="team", max_memory_mib=6 * GIB_MIB, max_cores=50)
    plan(budget(), '{"main": {"memory": "5Gi"}}', policy)  # 5 + 1 = 6Gi: fits
    with pytest.raises(ResizeError, match='over the per-pod GPUQuota "team" max 6Gi'):
        plan(budget(), '{"main": {"memory": "5121Mi"}}', policy)
    with pytest.raises(ResizeError, match="51 cores, over"):
        plan(budget(), '{"main": {"cores": 41}}', policy)


@settings(max_examples=200, deadline=None)
@given(mem0=st.integers(1, 65536), cores0=st.integers(0, 100), mem1=st.integers(1, 65536),
       cores1=st.integers(0, 100))
def test_grow_minus_shrink_is_the_usage_change(mem0: int, cores0: int, mem1: int,
                                               cores1: int) -> None:
    b = budget(mem0, cores0)
    p = plan(b, json.dumps({"main": {"memory": f"{mem1}Mi", "cores": cores1}}), QuotaPolicy())
    old, new = usage_of(b), usage_of(p.budget)
    assert new.memory_mib - old.memory_mib == p.grow.memory_mib - p.shrink.memory_mib
    assert new.cores - old.cores == p.grow.cores - p.shrink.cores
    assert min(p.grow.memory_mib, p.shrink.memory_mib) == 0
    assert min(p.grow.cores, p.shrink.cores) == 0
    assert new.memory_mib == mem1 + 1024 and new.cores == cores1 + 10


def test_status_round_trip_and_unreadable() -> None:
    s = ResizeStatus(digest("x"), "Approved", previous='{"a":1}',
                     grow={"memoryMiB": 5, "cores": 0})
    assert ResizeStatus.parse(s.to_annotation()) == s
    assert ResizeStatus.parse("{") is None
    assert ResizeStatus.parse('{"request": "a", "state": "Weird"}') is None
    assert digest("x") != digest("y")
    assert parse_request('{"main": {"memory": "1Gi"}}') == {"main": (1024, None)}
    assert parse_request('{"main": {"cores": 5}, "@id": "x"}') == {"main": (None, 5)}
    with pytest.raises(ResizeError, match="names no container"):
        parse_request('{"@id": "x"}')
    with pytest.raises(ResizeError, match="@id must be a string"):
        parse_request('{"main": {"cores": 5}, "@id": 3}')


KEY = b"k" * 32


def test_a_sealed_record_holds_for_its_pod_and_through_the_nodes_refusal_only() -> None:
    approved = ResizeStatus(digest("x"), "Approved", previous='{"a":1}',
                            grow={"memoryMiB": 5, "cores": 0}).sealed(KEY, "uid-1")
    assert approved.seal_holds(KEY, "uid-1")
    parsed = ResizeStatus.parse(approved.to_annotation())
    assert parsed == approved and parsed is not None and parsed.seal_holds(KEY, "uid-1")
    # the node daemon turns it into a refusal the way it does (dataclasses.replace): it holds
    refused = replace(approved, state="Refused", reason="on this node: …")
    assert ResizeStatus.parse(refused.to_annotation()).seal_holds(KEY, "uid-1")  # type: ignore
    # another pod, another key, a changed previous or growth, no seal: it does not
    assert not approved.seal_holds(KEY, "uid-2")
    assert not approved.seal_holds(b"j" * 32, "uid-1")
    assert not replace(approved, previous='{"a":80}').seal_holds(KEY, "uid-1")
    assert not replace(approved, grow={"memoryMiB": 50, "cores": 0}).seal_holds(KEY, "uid-1")
    assert not replace(approved, seal=None).seal_holds(KEY, "uid-1")
    assert ResizeStatus.parse('{"request":"r","state":"Refused","previous":{"x":1}}'
                              ) == ResizeStatus("r", "Refused")  # a previous not a string
