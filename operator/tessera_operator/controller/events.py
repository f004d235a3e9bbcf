"""Conditions the leader writes become Events: every change of a condition's status or
reason is posted on the object (Warning for Degraded=True and a Ready=False that is not
merely in progress)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from tessera.api.conditions import DEGRADED, PROGRESSING, READY, Condition
from tessera.api.names import API_VERSION
from tessera.kube.client import Kube
from tessera.kube.events import post_event
from tessera.partition import transitions


def conditions(raw: Any) -> list[Condition]:
    """The conditions of a stored status (one that cannot be read is left out)."""
    out = []
    for c in raw or []:
        try:
            out.append(Condition.model_validate(c))
        except ValidationError:
            continue
    return out


def dump(conds: list[Condition]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in conds]


async def post_transitions(kube: Kube, obj: Mapping[str, Any], kind: str,
                           old: list[Condition], new: list[Condition], component: str) -> None:
    for c in transitions(old, new):
        if c.type == PROGRESSING and c.status == "False" and not old:
            continue
        warning = (c.type == DEGRADED and c.status == "True") or (
            c.type == READY and c.status == "False" and c.reason not in (
                "Applying", "Counting"))
        await post_event(kube, obj, API_VERSION, kind, c.reason,
                         f"{c.type}={c.status}: {c.message}",
                         "Warning" if warning else "Normal", component)
