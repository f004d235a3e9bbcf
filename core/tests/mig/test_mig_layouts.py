"""fit, feasible and maximal layouts against the brute-force oracle (mig_oracle.py)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mig_oracle import NAMES, feasible, is_valid_state, maximal

from tessera.mig.planner import LayoutError, feasible_layouts, fit, maximal_layouts, validate
from tessera.mig.planner import Placement as P
from tessera.models import MODELS

MODEL_IDS = [m.id for m in MODELS]


@pytest.mark.parametrize("with_me", [False, True])
@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_feasible_and_maximal_layouts_equal_the_oracle(model_id: str, with_me: bool) -> None:
    got_feasible = feasible_layouts(model_id, include_media_extensions=with_me)
    got_maximal = maximal_layouts(model_id, include_media_extensions=with_me)
    assert len(got_feasible) == len(set(got_feasible))
    assert set(got_feasible) == feasible(model_id, with_me)
    assert set(got_maximal) == maximal(model_id, with_me)
    assert all(list(layout) == sorted(layout) for layout in got_maximal)


@pytest.mark.parametrize("model_id", [m for m in MODEL_IDS if m != "A30-24GB"])
def test_reference_counts_for_eight_slice_gpus(model_id: str) -> None:
    assert (len(feasible_layouts(model_id)), len(maximal_layouts(model_id))) == (77, 28)


def test_reference_counts_and_layouts_for_the_a30() -> None:
    assert len(feasible_layouts("A30-24GB")) == 9
    assert sorted(maximal_layouts("A30-24GB")) == sorted([
        ("4g.24gb",), ("2g.12gb", "2g.12gb"), ("1g.6gb", "1g.6gb", "2g.12gb"),
        ("1g.6gb",) * 4,
    ])


def test_largest_first_trap_puts_the_3g_at_slot_4() -> None:
    # NVIDIA's guide: -cgi 19,19,14,9 fails, 9,19,14,19 works; the order given must not matter.
    for order in (["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
                  ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]):
        placements = fit("H100-80GB", order)
        assert P("3g.40gb", 4, 4) in placements
        assert is_valid_state("H100-80GB", [(p.profile, p.start) for p in placements])
    assert fit("A100-80GB", ["3g.40gb", "2g.20gb", "2g.20gb"]) == [
        P("2g.20gb", 0, 2), P("2g.20gb", 2, 2), P("3g.40gb", 4, 4)
    ]


@pytest.mark.parametrize(
    ("model_id", "layout", "reason"),
    [
        ("H100-80GB", ["3g.40gb", "3g.40gb", "1g.10gb"], "memory slices run out: .* needs 9"),
        ("H100-80GB", ["4g.40gb", "4g.40gb"], r"at most 1 fit on H100-80GB"),
        ("H100-80GB", ["1g.10gb"] * 7 + ["1g.10gb+me"], "compute slices run out: .* needs 8"),
        ("A30-24GB", ["2g.12gb"] * 3, "at most 2 fit"),
        ("B200-180GB", ["7g.180gb", "1g.23gb"], "memory slices run out"),
    ],
)
def test_a_layout_that_does_not_fit_says_which_resource_runs_out(
    model_id: str, layout: list[str], reason: str
) -> None:
    with pytest.raises(LayoutError, match=reason):
        fit(model_id, layout)


def test_validate_names_the_overlap_and_bad_start() -> None:
    validate("H100-80GB", [P("4g.40gb", 0), P("3g.40gb", 4)])
    with pytest.raises(LayoutError, match=r"3g.40gb@0 overlaps 4g.40gb@0"):
        validate("H100-80GB", [P("4g.40gb", 0), P("3g.40gb", 0)])
    with pytest.raises(LayoutError, match=r"cannot start at slot 7.*0,1,2,3,4,5,6"):
        validate("H100-80GB", [P("1g.10gb", 7)])


@st.composite
def model_and_multiset(draw: st.DrawFn) -> tuple[str, list[str]]:
    model_id = draw(st.sampled_from(MODEL_IDS))
    names = sorted(NAMES[model_id])
    return model_id, draw(st.lists(st.sampled_from(names), min_size=1, max_size=9))


@settings(max_examples=300, deadline=None)
@given(model_and_multiset())
def test_fit_succeeds_exactly_when_the_oracle_finds_a_placement(
    case: tuple[str, list[str]],
) -> None:
    model_id, layout = case
    expected = tuple(sorted(layout)) in feasible(model_id, True)
    try:
        placements = fit(model_id, layout)
    except LayoutError:
        assert not expected
        return
    assert expected
    assert Counter(p.profile for p in placements) == Counter(layout)
    assert is_valid_state(model_id, [(p.profile, p.start) for p in placements])
