"""Standard ``status.conditions`` (metav1.Condition) and the helper that keeps them honest.

Argo CD health checks, kstatus and ``kubectl wait --for=condition=Ready`` read these; a
condition's ``lastTransitionTime`` must only move when its status flips, or every
reconcile looks like a transition.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from tessera.api.meta import ApiModel

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"

ConditionStatus = Literal["True", "False", "Unknown"]


def _parse_time(value: Any) -> Any:
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with second precision, as metav1.Time serialises."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Timestamp = Annotated[
    datetime,
    BeforeValidator(_parse_time),
    PlainSerializer(format_time, return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class Condition(ApiModel):
    """One aspect of the object's state, as ``metav1.Condition``."""

    type: str = Field(
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        max_length=316,
    )
    """Condition type in CamelCase: Ready, Progressing or Degraded."""
    status: ConditionStatus
    """True, False or Unknown."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The metadata.generation this condition was computed from."""
    last_transition_time: Timestamp
    """When the status last changed (not when it was last checked)."""
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    """CamelCase machine-readable reason for the last transition."""
    message: str = Field(default="", max_length=32768)
    """Human-readable details."""


def get_condition(conditions: Sequence[Condition], type_: str) -> Condition | None:
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    found = get_condition(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; other conditions and their order are kept.

    ``lastTransitionTime`` stays as it was when the status is unchanged, even if the reason,
    message or generation change (that is what the field means in metav1.Condition).
    """
    previous = get_condition(conditions, type_)
    when = now or datetime.now(UTC)
    transition = (
        previous.last_transition_time
        if previous is not None and previous.status == status
        else when
    )
    updated = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=observed_generation,
        last_transition_time=transition,
    )
    if previous is None:
        return [*conditions, updated]
    return [updated if c.type == type_ else c for c in conditions]
