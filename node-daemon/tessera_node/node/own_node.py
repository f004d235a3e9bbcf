"""This daemon's own Node, as its watch last showed it (or as the reconciler's last write
returned it): the one object the daemon writes (I/O: the watch)."""

from __future__ import annotations

from collections.abc import Callable

from tessera.kube.client import Kube, Obj, follow, path
from tessera.kube.health import Health

NODE_WATCH = "node"


class OwnNode:
    def __init__(self, kube: Kube, name: str, health: Health,
                 on_change: Callable[[], None] = lambda: None) -> None:
        self.kube = kube
        self.name = name
        self.health = health
        self.on_change = on_change
        self.obj: Obj | None = None
        self.listed = False

    def current(self) -> Obj | None:
        return self.obj

    async def watch(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                items = obj.get("items") or []
                self.obj = items[0] if items else None
                self.listed = True
            elif typ == "DELETED":
                self.obj = None
            else:
                self.obj = obj
            self.on_change()
        await follow(self.kube.watch(
            path("", "v1", "nodes"), field_selector=f"metadata.name={self.name}",
            name=NODE_WATCH, health=self.health), handle, NODE_WATCH)
