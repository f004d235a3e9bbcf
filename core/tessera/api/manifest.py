"""Load a manifest dict into its API type with a one-line error that names the field.

The path is spelled as the API server spells it (``spec.layout.profiles[0].name``) so that
a user sees the same field whether the CLI, a webhook or ``kubectl apply`` rejected it.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from tessera.api.meta import FieldPathError
from tessera.api.names import API_VERSION
from tessera.api.partition import GPUPartition
from tessera.api.quota import GPUQuota

KINDS: dict[str, type[GPUPartition] | type[GPUQuota]] = {
    "GPUPartition": GPUPartition,
    "GPUQuota": GPUQuota,
}


class ManifestError(ValueError):
    """One line: ``<dotted.field.path>: <what is wrong>``."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


def format_path(loc: tuple[int | str, ...]) -> str:
    """``("spec", "profiles", 0, "name")`` -> ``spec.profiles[0].name``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _error_path(error: ErrorDetails) -> str:
    loc = tuple(p for p in error["loc"] if not _is_union_tag(p))
    path = format_path(loc)
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldPathError):
        sep = "" if cause.path.startswith("[") or not path else "."
        path = f"{path}{sep}{cause.path}"
    return path


def _is_union_tag(part: int | str) -> bool:
    # pydantic names the branch of a union it tried (e.g. "function-plain[...]").
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def _message(error: ErrorDetails) -> str:
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldPathError):
        return cause.message
    if error["type"] == "extra_forbidden":
        return "unknown field"
    if error["type"] == "missing":
        return "Required value"
    msg = error["msg"].removeprefix("Value error, ")
    return f"{msg} (got {error['input']!r})" if error["type"] != "model_type" else msg


def load_manifest(obj: Any) -> GPUPartition | GPUQuota:
    """Validate one manifest (a dict as YAML/JSON gives it) into GPUPartition or GPUQuota."""
    if not isinstance(obj, dict):
        raise ManifestError("", "a manifest must be a mapping")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if api_version != API_VERSION:
        raise ManifestError("apiVersion", f"must be {API_VERSION}, got {api_version!r}")
    if kind not in KINDS:
        raise ManifestError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    try:
        return KINDS[kind].model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ManifestError(_error_path(first), _message(first)) from None
