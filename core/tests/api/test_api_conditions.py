"""set_condition moves lastTransitionTime only when the status flips."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tessera.api import DEGRADED, READY, Condition, get_condition, is_true, set_condition

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_new_condition_is_appended_with_now() -> None:
    conds = set_condition([], READY, "False", "Applying", "2 of 3 nodes", 1, T0)
    assert len(conds) == 1
    assert conds[0].last_transition_time == T0
    assert not is_true(conds, READY)


def test_same_status_keeps_transition_time_but_updates_the_rest() -> None:
    conds = set_condition([], READY, "False", "Applying", "1 of 3", 1, T0)
    conds = set_condition(conds, READY, "False", "Applying", "2 of 3", 2, T1)
    ready = get_condition(conds, READY)
    assert ready is not None
    assert ready.last_transition_time == T0
    assert (ready.message, ready.observed_generation) == ("2 of 3", 2)


def test_flip_moves_transition_time_and_keeps_others_in_order() -> None:
    conds = set_condition([], DEGRADED, "False", "NoProblems", "", 1, T0)
    conds = set_condition(conds, READY, "False", "Applying", "", 1, T0)
    conds = set_condition(conds, READY, "True", "Applied", "", 1, T1)
    assert [c.type for c in conds] == [DEGRADED, READY]
    assert conds[1].last_transition_time == T1
    assert conds[0].last_transition_time == T0
    assert is_true(conds, READY)


def test_wire_form_is_metav1() -> None:
    cond = set_condition([], READY, "True", "Applied", "ok", 3, T0)[0]
    wire = cond.to_dict()
    assert wire == {"type": "Ready", "status": "True", "reason": "Applied", "message": "ok",
                    "observedGeneration": 3, "lastTransitionTime": "2026-01-01T00:00:00Z"}
    assert Condition.model_validate(wire) == cond
