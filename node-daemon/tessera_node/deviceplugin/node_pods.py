"""The pods bound to this node, as the pod watch shows them (I/O: the watch; any thread
reads).

The device plugin matches Allocates to their pods from these, asks the kubelet only about
those that can hold a device of tessera's, and finds approved live resizes on them; a pod
missing from them counts as ended, so nothing is decided before the watch listed.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tessera.api.names import MIG_PREFIX, VGPU
from tessera.kube.client import Kube, Obj, follow, path
from tessera.kube.health import Health
from tessera_node.deviceplugin.matcher import ENDED, PodView, pod_view

log = logging.getLogger("tessera_node.deviceplugin")

POD_WATCH = "pods"

PodKey = tuple[str, str]
"""(namespace, name)."""


class NodePods:
    def __init__(self, kube: Kube, node_name: str, health: Health,
                 on_change: Callable[[tuple[PodView, ...]], None] = lambda views: None
                 ) -> None:
        self.kube = kube
        self.node_name = node_name
        self.health = health
        self.on_change = on_change
        """Called in the event loop with the pods after every event."""
        self.objects: dict[PodKey, Obj] = {}
        """The pods as the API serves them."""
        self._views: tuple[PodView, ...] = ()
        self._cond = threading.Condition()
        self.version = 0
        """Bumped at every event (``wait_change``)."""
        self._seen: dict[str, int] = {}
        """Pod UID -> the event that first showed it (``PodView.seen``: the kubelet's order)."""
        self._events = 0

    def listed(self) -> bool:
        """Whether the watch has listed the node's pods (before that, a pod not known yet
        would count as ended)."""
        return self.health.synced(POD_WATCH)

    async def watch(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.objects = {key_of(o): o for o in obj.get("items") or []}
            elif typ == "DELETED":
                self.objects.pop(key_of(obj), None)
            else:
                self.objects[key_of(obj)] = obj
            views = []
            self._events += 1
            uids = {str((o.get("metadata") or {}).get("uid", "")) for o in self.objects.values()}
            self._seen = {u: n for u, n in self._seen.items() if u in uids}
            for o in self.objects.values():
                try:
                    view = pod_view(o)
                    views.append(dataclasses.replace(
                        view, seen=self._seen.setdefault(view.uid, self._events)))
                except (KeyError, TypeError, ValueError) as exc:  # one odd pod, not all
                    log.warning("pod not understood", extra={"pod": "/".join(key_of(o)),
                                                             "error": str(exc)})
            self.show(tuple(views))
            self.on_change(self._views)
        await follow(self.kube.watch(path("", "v1", "pods"),
                                     field_selector=f"spec.nodeName={self.node_name}",
                                     name=POD_WATCH, health=self.health), handle, POD_WATCH)

    def show(self, views: tuple[PodView, ...]) -> None:
        """The pods are these now (the watch; a test)."""
        with self._cond:
            self._views = views
            self.version += 1
            self._cond.notify_all()

    def views(self) -> tuple[PodView, ...]:
        return self._views

    def wait_change(self, seen: int, timeout: float) -> None:
        """Until an event after ``version`` was ``seen``, or ``timeout`` seconds (any thread)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version != seen, max(timeout, 0))

    def asking(self) -> dict[PodKey, PodView]:
        """The pods that ask for a device of tessera's and have not ended."""
        return {(p.namespace, p.name): p for p in self._views
                if p.phase not in ENDED and any(is_device(r) for lim in p.limits.values()
                                                for r in lim)}


def key_of(obj: Mapping[str, Any]) -> PodKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def is_device(resource: str) -> bool:
    """A resource tessera's device plugin allocates (shares or whole MIG instances)."""
    return resource == VGPU or resource.startswith(MIG_PREFIX)
