"""What every tessera API type shares: model config, ObjectMeta, field paths.

Kept apart from the kinds so that conditions, budgets and the CRD generator depend on one
small module and never on each other.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every spec/status type.

    camelCase on the wire, snake_case in Python; unknown fields fail (as ``kubectl apply``'s
    strict field validation does) and no type coercion (``"10"`` is not an integer to the API
    server either); attribute docstrings become the CRD's descriptions for ``kubectl explain``.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        use_attribute_docstrings=True,
        validate_assignment=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The wire form: camelCase, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ObjectMeta(BaseModel):
    """The few ``metadata`` fields tessera reads; everything else is kept as it came."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow"
    )

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    resource_version: str | None = None
    uid: str | None = None


class FieldPathError(ValueError):
    """A cross-field rule failed on ``path`` (relative to the model that checks it).

    The same rules exist as CEL in the CRD with ``fieldPath`` set, so both the API server
    and :func:`tessera.api.manifest.load_manifest` name the same field.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message
