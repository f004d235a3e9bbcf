"""The extended resources a container asks for: MIG profile <-> resource name.

The names themselves are in :mod:`tessera.api.names`.  Memory and cores are totals per
container (split evenly over its shares) so that the scheduler, ResourceQuota and GPUQuota
all count the same number.
"""

from __future__ import annotations

import re

from tessera.api.names import MIG_PREFIX
from tessera.api.profile import PROFILE_NAME_PATTERN

_PROFILE_RE = re.compile(PROFILE_NAME_PATTERN)
_BASE_RE = re.compile(r"^([1-8]c\.)?[1-8]g\.[1-9][0-9]{0,3}gb")


def mig_resource_name(profile: str) -> str:
    """``1g.10gb+me`` -> ``tessera.dev/mig-1g.10gb.me`` ('+' is not allowed in resource names)."""
    if not _PROFILE_RE.fullmatch(profile):
        raise ValueError(f"{profile!r} is not a MIG profile name (e.g. 1g.10gb, 1g.10gb+me)")
    return MIG_PREFIX + profile.replace("+", ".")


def profile_from_resource(resource: str) -> str | None:
    """Inverse of :func:`mig_resource_name`; None for any other resource name."""
    if not resource.startswith(MIG_PREFIX):
        return None
    rest = resource[len(MIG_PREFIX):]
    base = _BASE_RE.match(rest)
    if base is None:
        return None
    tail = rest[base.end():]
    profile = base.group(0) + ("+" + tail[1:] if tail.startswith(".") else tail)
    return profile if _PROFILE_RE.fullmatch(profile) else None

