"""Minimal-disruption plans, checked step by step against the brute-force oracle."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mig_oracle import all_states, feasible, is_valid_state, min_destroys

from tessera.mig.planner import (
    DisruptionError,
    DisruptionPolicy,
    Instance,
    LayoutError,
    Plan,
    Step,
    plan,
)
from tessera.models import MODELS

MODEL_IDS = [m.id for m in MODELS]


def run_steps(model_id: str, current: list[Instance], result: Plan) -> set[tuple[str, int]]:
    """Apply the steps one at a time; every state on the way must be valid, no busy one dies."""
    busy = {(i.profile, i.start) for i in current if i.busy}
    state = {(i.profile, i.start) for i in current}
    for step in result.steps:
        key = (step.profile, step.start)
        if step.action == "destroy":
            assert key in state and key not in busy, f"{step} destroys a missing or busy instance"
            state.remove(key)
        else:
            assert key not in state
            state.add(key)
        assert is_valid_state(model_id, state), f"invalid state after {step}: {sorted(state)}"
    return state


@st.composite
def plan_case(draw: st.DrawFn) -> tuple[str, list[Instance], list[str]]:
    model_id = draw(st.sampled_from(MODEL_IDS))
    state = sorted(draw(st.sampled_from(all_states(model_id, True))))
    busy = draw(st.lists(st.booleans(), min_size=len(state), max_size=len(state)))
    current = [Instance(n, s, b) for (n, s), b in zip(state, busy, strict=True)]
    desired = list(draw(st.sampled_from(sorted(feasible(model_id, True)))))
    return model_id, current, draw(st.permutations(desired))


@settings(max_examples=300, deadline=None)
@given(plan_case())
def test_plan_is_minimal_valid_at_every_step_and_spares_busy_instances(
    case: tuple[str, list[Instance], list[str]],
) -> None:
    model_id, current, desired = case
    cur = [(i.profile, i.start) for i in current]
    busy = [(i.profile, i.start) for i in current if i.busy]
    fewest = min_destroys(model_id, cur, desired, must_keep=busy)

    if fewest is None:  # a busy instance has to go
        with pytest.raises(DisruptionError, match="busy"):
            plan(model_id, current, desired, DisruptionPolicy.REFUSE)
        waiting = plan(model_id, current, desired, DisruptionPolicy.WAIT)
        assert waiting.steps == () and waiting.waiting_for
        assert all(i.busy for i in waiting.waiting_for)
        # once idle, the pending steps would do the job
        idle = [Instance(i.profile, i.start) for i in current]
        state = run_steps(model_id, idle, Plan(waiting.pending_steps, (), ()))
        assert Counter(n for n, _ in state) == Counter(desired)
        return

    result = plan(model_id, current, desired, DisruptionPolicy.REFUSE)
    assert result.waiting_for == ()
    final = run_steps(model_id, current, result)
    assert Counter(n for n, _ in final) == Counter(desired)
    assert final == {(p.profile, p.start) for p in result.final}
    assert result.destroys == fewest
    assert {(p.profile, p.start) for p in result.kept} == set(cur) & final
    # destroys come first, so the GPU never holds more than the current or the final layout
    actions = [s.action for s in result.steps]
    assert actions == sorted(actions, key=lambda a: a != "destroy")
    # planning again from where the plan leaves the GPU changes nothing
    again = plan(model_id, [Instance(n, s) for n, s in sorted(final)], desired[::-1])
    assert again.steps == ()


def test_nothing_to_do_when_the_gpu_already_has_the_layout() -> None:
    current = [Instance("3g.40gb", 4, busy=True), Instance("2g.20gb", 0), Instance("2g.20gb", 2)]
    result = plan("H100-80GB", current, ["2g.20gb", "3g.40gb", "2g.20gb"])
    assert result.steps == () and len(result.kept) == 3


def test_largest_first_trap_does_not_bite_from_an_empty_gpu() -> None:
    result = plan("A100-40GB", [], ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"])
    assert Step("create", "3g.20gb", 4) in result.steps
    assert run_steps("A100-40GB", [], result)


def test_a_busy_instance_is_kept_where_it_is_and_the_rest_rearranged() -> None:
    # a busy 3g at 0 forces the new 2g to slot 4 and the 1g to slot 6
    current = [Instance("3g.40gb", 0, busy=True), Instance("1g.10gb", 4), Instance("1g.10gb", 5)]
    result = plan("H100-80GB", current, ["3g.40gb", "2g.20gb", "1g.10gb"])
    assert result.destroys == 2  # a 1g could stay at 5 only if the 2g fit elsewhere; it cannot
    assert [s for s in result.steps if s.action == "create"] == [
        Step("create", "2g.20gb", 4), Step("create", "1g.10gb", 6)
    ]


def test_wait_and_refuse_when_a_busy_instance_blocks() -> None:
    current = [Instance("7g.80gb", 0, busy=True)]
    waiting = plan("H100-80GB", current, ["3g.40gb", "3g.40gb"], DisruptionPolicy.WAIT)
    assert waiting.steps == () and waiting.waiting_for == (current[0],)
    assert waiting.pending_steps[0] == Step("destroy", "7g.80gb", 0)
    with pytest.raises(DisruptionError, match=r"7g.80gb@0 \(busy\)"):
        plan("H100-80GB", current, ["3g.40gb", "3g.40gb"], DisruptionPolicy.REFUSE)


def test_invalid_current_state_or_desired_layout_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match="overlaps"):
        plan("H100-80GB", [Instance("4g.40gb", 0), Instance("3g.40gb", 0)], ["7g.80gb"])
    with pytest.raises(LayoutError, match="memory slices run out"):
        plan("H100-80GB", [], ["7g.80gb", "1g.10gb"])
