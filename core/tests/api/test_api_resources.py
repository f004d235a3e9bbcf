"""Pod-facing resource names and the budget annotation."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api import (
    ANNOTATION_BUDGET,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
    BudgetAnnotation,
    BudgetAnnotationError,
    PerShareBudget,
    mig_resource_name,
    parse_budget_annotation,
    profile_from_resource,
)
from tessera.api.profile import PROFILE_NAME_PATTERN

# Kubernetes' extended resource name: a DNS prefix, '/', and a qualified name.
RESOURCE_RE = re.compile(r"^[a-z0-9.-]+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def test_names() -> None:
    assert (VGPU, VGPU_MEMORY, VGPU_CORES) == (
        "tessera.dev/vgpu", "tessera.dev/vgpu-memory", "tessera.dev/vgpu-cores")
    assert ANNOTATION_BUDGET == "tessera.dev/budget"
    assert mig_resource_name("1g.10gb+me") == "tessera.dev/mig-1g.10gb.me"
    assert mig_resource_name("1g.24gb-me") == "tessera.dev/mig-1g.24gb-me"
    assert profile_from_resource("tessera.dev/mig-1g.10gb.me.all") == "1g.10gb+me.all"
    assert profile_from_resource("nvidia.com/mig-1g.10gb") is None
    assert profile_from_resource("tessera.dev/mig-banana") is None
    with pytest.raises(ValueError):
        mig_resource_name("1g10gb")


@given(st.from_regex(re.compile(PROFILE_NAME_PATTERN), fullmatch=True))
def test_mig_names_are_valid_resources_and_invert(profile: str) -> None:
    name = mig_resource_name(profile)
    assert RESOURCE_RE.fullmatch(name) and len(name.split("/")[1]) <= 63
    assert profile_from_resource(name) == profile


def test_budget_split_and_round_trip() -> None:
    c = PerShareBudget.from_totals(shares=2, memory_mib=16384, cores=75)
    assert c.memory_bytes == 8 * 2**30
    assert c.cores == 37.5
    budget = BudgetAnnotation(quota="ml-research", weight=2, containers={"main": c})
    text = budget.to_annotation()
    assert text == (
        '{"containers":{"main":{"cores":37.5,"memoryBytes":8589934592,"mig":{},"shares":2}},"lending":true,'
        '"quota":"ml-research","version":1,"weight":2}'
    )
    assert parse_budget_annotation(text) == budget


@given(st.integers(1, 8), st.integers(0, 2**20), st.integers(0, 800))
def test_split_never_exceeds_totals(shares: int, mib: int, cores: int) -> None:
    c = PerShareBudget.from_totals(shares, mib, min(cores, 100 * shares))
    assert c.memory_bytes * shares <= mib * 2**20
    assert c.cores * shares == pytest.approx(min(cores, 100 * shares))


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"version": 2}', "version"),
        ('{"containers": {"c": {"shares": 1, "memoryBytes": -1, "cores": 10}}}',
         "containers.c.memoryBytes"),
        ('{"containers": {"c": {"shares": 1, "memoryBytes": 1, "cores": 10, "x": 1}}}',
         "containers.c.x"),
    ],
)
def test_bad_budget_is_one_line(text: str, needle: str) -> None:
    with pytest.raises(BudgetAnnotationError) as caught:
        parse_budget_annotation(text)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
