"""A Node label selector with metav1.LabelSelector's shape and rules.

Kept identical to Kubernetes' own type so that users can paste selectors from Deployments
and the operator can hand them to the API server's ``labelSelector`` query unchanged.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from tessera.api.crdtools import cel
from tessera.api.meta import ApiModel, FieldPathError

LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63)]

_VALUES_RULE = cel(
    "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
    " : (!has(self.values) || size(self.values) == 0)",
    "values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist",
    ".values",
)


class LabelSelectorRequirement(ApiModel):
    """``key operator values``, as in metav1.LabelSelectorRequirement."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [_VALUES_RULE]})

    key: LabelKey
    """The label key the requirement applies to."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the key relates to the values."""
    values: list[LabelValue] | None = Field(default=None, max_length=64)
    """Values for In and NotIn; empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_match_operator(self) -> Self:
        has_values = bool(self.values)
        if (self.operator in ("In", "NotIn")) != has_values:
            raise FieldPathError("values", _VALUES_RULE["message"])
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        inside = present and labels[self.key] in (self.values or [])
        return inside if self.operator == "In" else not inside


class LabelSelector(ApiModel):
    """Selects Nodes by label; all terms must hold, and an empty selector selects every node."""

    match_labels: dict[LabelKey, LabelValue] | None = Field(default=None, max_length=64)
    """Labels a node must carry with exactly these values."""
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=32)
    """Further requirements, ANDed with matchLabels."""

    def matches(self, labels: dict[str, str]) -> bool:
        wanted = self.match_labels or {}
        if any(labels.get(k) != v for k, v in wanted.items()):
            return False
        return all(r.matches(labels) for r in self.match_expressions or [])
