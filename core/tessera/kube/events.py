"""Kubernetes Events (``v1``): how tessera tells users what happened to their objects."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from tessera.kube.client import ApiError, Kube, Obj, path

log = logging.getLogger("tessera.events")

EventType = Literal["Normal", "Warning"]
MESSAGE_LIMIT = 1000
"""The API server refuses longer Event messages."""


def event_body(obj: Mapping[str, Any], api_version: str, kind: str, reason: str, message: str,
               type_: EventType, component: str) -> Obj:
    """An Event about ``obj`` (named by kind: items of a LIST carry no kind of their own)."""
    meta = obj["metadata"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.",
                     "namespace": meta.get("namespace") or "default"},
        "involvedObject": {"apiVersion": api_version, "kind": kind,
                           "name": meta["name"], "namespace": meta.get("namespace"),
                           "uid": meta.get("uid"),
                           "resourceVersion": meta.get("resourceVersion")},
        "reason": reason, "message": message[:MESSAGE_LIMIT], "type": type_,
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": component},
        "reportingComponent": component, "reportingInstance": component,
    }


async def post_event(kube: Kube, obj: Mapping[str, Any], api_version: str, kind: str,
                     reason: str, message: str, type_: EventType, component: str) -> None:
    """Best effort: an Event that cannot be posted is logged, never raised."""
    body = event_body(obj, api_version, kind, reason, message, type_, component)
    try:
        await kube.create(path("", "v1", "events", body["metadata"]["namespace"]), body)
    except (ApiError, OSError, TimeoutError) as exc:
        log.warning("event not posted", extra={"reason": reason, "error": str(exc)})
