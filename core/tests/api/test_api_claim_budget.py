"""``tessera.dev/claim-budget``: the live budget of a pod's DRA claims, written by the
operator and obeyed by the node daemon; what each side reads back is what the other wrote,
and an annotation either cannot honour is refused with the claim and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.claim_budget import (
    ClaimBudget,
    ClaimBudgetError,
    claim_budgets_text,
    parse_claim_budgets,
)
from tessera.api.names import ANNOTATION_CLAIM_BUDGET

GROWN = ClaimBudget("infer-gpu-x7k2q", 12288, 40, 4096, 30)


def entry(**over: object) -> dict[str, object]:
    out: dict[str, object] = {"claim": "infer-gpu-x7k2q", "memoryMiB": 12288, "cores": 40,
                              "allocatedMemoryMiB": 4096, "allocatedCores": 30}
    out.update(over)
    return out


def test_the_documented_example_reads_back_and_writes_the_same() -> None:
    assert ANNOTATION_CLAIM_BUDGET == "tessera.dev/claim-budget"
    text = json.dumps({"0b6c": entry()})
    got = parse_claim_budgets(text)
    assert got == {"0b6c": GROWN}
    assert json.loads(claim_budgets_text(got)) == json.loads(text)
    assert parse_claim_budgets(claim_budgets_text(got)) == got


def test_no_annotation_or_an_empty_one_is_no_budget() -> None:
    """A claim that is not listed has its allocation as its budget."""
    assert parse_claim_budgets(None) == {}
    assert parse_claim_budgets("") == {}
    assert parse_claim_budgets("{}") == {}
    assert claim_budgets_text({}) == "{}"  # what taking a growth back writes


def test_the_text_is_compact_and_in_a_stable_order() -> None:
    """The operator writes it in a merge patch: the same budgets, the same bytes."""
    a = {"b": GROWN, "a": ClaimBudget("other", 1024, 10, 2048, 20)}
    b = dict(reversed(list(a.items())))
    assert claim_budgets_text(a) == claim_budgets_text(b)
    assert " " not in claim_budgets_text(a)
    assert list(json.loads(claim_budgets_text(a))) == ["a", "b"]


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object by claim UID"),
    ('"0b6c"', "JSON object by claim UID"),
    ("null", "JSON object by claim UID"),
    (json.dumps({"u1": "infer-gpu"}), "claim u1: must be an object naming its claim"),
    (json.dumps({"u1": entry(claim=None)}), "claim u1: must be an object naming its claim"),
    (json.dumps({"u1": {k: v for k, v in entry().items() if k != "claim"}}),
     "must be an object naming its claim"),
    (json.dumps({"u1": entry(cores=0)}), r"cores must be a whole number 1\.\.100, not 0"),
    (json.dumps({"u1": entry(cores=101)}), r"cores must be a whole number 1\.\.100, not 101"),
    (json.dumps({"u1": entry(allocatedCores=101)}), r"allocatedCores must be .* 1\.\.100"),
    (json.dumps({"u1": entry(memoryMiB=0)}), "memoryMiB must be a whole number >= 1, not 0"),
    (json.dumps({"u1": entry(allocatedMemoryMiB=0)}), "allocatedMemoryMiB must be"),
    (json.dumps({"u1": entry(memoryMiB=-5)}), "memoryMiB must be"),
    (json.dumps({"u1": entry(memoryMiB=1.5)}), "memoryMiB must be a whole number"),
    (json.dumps({"u1": entry(memoryMiB="4Gi")}), "memoryMiB must be a whole number"),
    (json.dumps({"u1": entry(cores=True)}), "cores must be a whole number 1..100, not True"),
    (json.dumps({"u1": entry(memoryMiB=True)}), "memoryMiB must be a whole number"),
    (json.dumps({"u1": {k: v for k, v in entry().items() if k != "cores"}}),
     "cores must be a whole number 1..100, not None"),
])
def test_an_annotation_that_cannot_be_honoured_is_refused_naming_what(text: str,
                                                                      why: str) -> None:
    with pytest.raises(ClaimBudgetError, match=why):
        parse_claim_budgets(text)


def test_a_claim_budget_error_is_a_value_error() -> None:
    """Callers that read budgets defensively (quota counting) catch ValueError."""
    with pytest.raises(ValueError):
        parse_claim_budgets("{")


def test_the_bounds_themselves_are_accepted() -> None:
    got = parse_claim_budgets(json.dumps({"u1": entry(memoryMiB=1, cores=1, allocatedCores=100,
                                                      allocatedMemoryMiB=1)}))
    assert got["u1"] == ClaimBudget("infer-gpu-x7k2q", 1, 1, 1, 100)


@pytest.mark.parametrize(("budget", "growth"), [
    (ClaimBudget("c", 6144, 40, 4096, 30), (2048, 10)),  # both grew
    (ClaimBudget("c", 6144, 20, 4096, 30), (2048, 0)),  # memory up, cores down
    (ClaimBudget("c", 2048, 50, 4096, 30), (0, 20)),  # memory down, cores up
    (ClaimBudget("c", 2048, 10, 4096, 30), (0, 0)),  # shrunk below the allocation
    (ClaimBudget("c", 4096, 30, 4096, 30), (0, 0)),  # the allocation itself
])
def test_growth_is_only_what_goes_beyond_the_allocation(budget: ClaimBudget,
                                                       growth: tuple[int, int]) -> None:
    assert budget.growth == growth


budgets = st.builds(ClaimBudget, st.text(min_size=1, max_size=20), st.integers(1, 1 << 20),
                    st.integers(1, 100), st.integers(1, 1 << 20), st.integers(1, 100))


@given(st.dictionaries(st.text(min_size=1, max_size=12), budgets, max_size=5))
def test_whatever_the_operator_writes_the_node_reads_back(
        written: dict[str, ClaimBudget]) -> None:
    got = parse_claim_budgets(claim_budgets_text(written))
    assert got == written
    for b in got.values():
        mem, cores = b.growth
        assert mem == max(0, b.memory_mib - b.allocated_memory_mib)
        assert cores == max(0, b.cores - b.allocated_cores)
