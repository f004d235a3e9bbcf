"""The claims this node's DRA plugin prepared, on disk (I/O): one JSON file under the state
directory, replaced atomically (written beside, flushed, renamed), so a daemon killed at any
point leaves the old list or the new one, never half of one.

A restarted daemon answers the kubelet's prepare of a claim it prepared from here (the same
devices and CDI IDs, without asking the API server again: the claim may be gone already,
its pods still running) and writes again what is missing; unprepare drops the claim last,
after its files are gone.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera_node.dra.claims import Result, UnitBudget
from tessera_node.dra.files import write_atomically
from tessera_node.layout.on_demand import MadeInstance

VERSION = 1


class CheckpointError(ValueError):
    """The checkpoint cannot be read: the plugin does not serve (it would forget claims)."""


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    results: tuple[Result, ...]
    units: tuple[UnitBudget, ...]
    quota: str | None = None
    """Its namespace's GPUQuota (``namespace/name``) when it was prepared, if any."""
    weight: int = 1
    """That GPUQuota's fair-share weight for idle core time."""
    lending: bool = True
    """False: that GPUQuota's hard caps (no lending or borrowing of core time)."""
    allocated: tuple[UnitBudget, ...] | None = None
    """What its allocation gave, once a live resize made ``units`` differ (None: ``units``
    are the allocation's)."""
    made: tuple[MadeInstance, ...] = ()
    """The MIG instances made for it (migMode OnDemand): unprepare destroys them."""

    @property
    def allocation(self) -> tuple[UnitBudget, ...]:
        return self.units if self.allocated is None else self.allocated

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name,
                "results": [{"request": r.request, "pool": r.pool, "device": r.device,
                             "shareID": r.share_id} for r in self.results],
                "units": _units(self.units),
                "quota": self.quota, "weight": self.weight, "lending": self.lending,
                **({} if self.allocated is None else {"allocated": _units(self.allocated)}),
                **({"made": [m.to_json() for m in self.made]} if self.made else {})}

    @classmethod
    def from_json(cls, uid: str, data: dict[str, Any]) -> PreparedClaim:
        return cls(uid, str(data["namespace"]), str(data["name"]),
                   tuple(Result(str(r["request"]), str(r["pool"]), str(r["device"]),
                                r.get("shareID")) for r in data["results"]),
                   tuple(UnitBudget(str(u["uuid"]), u["memory"], u["cores"])
                         for u in data["units"]),
                   data.get("quota"), int(data.get("weight", 1)),
                   bool(data.get("lending", True)),
                   None if data.get("allocated") is None else tuple(
                       UnitBudget(str(u["uuid"]), u["memory"], u["cores"])
                       for u in data["allocated"]),
                   tuple(MadeInstance.from_json(m) for m in data.get("made") or ()))


def _units(units: tuple[UnitBudget, ...]) -> list[dict[str, Any]]:
    return [{"uuid": u.uuid, "memory": u.memory, "cores": u.cores} for u in units]


class Checkpoint:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._claims = self._load()

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: {exc}") from None
        try:
            if data.get("version") != VERSION:
                raise CheckpointError(f"{self.path}: version {data.get('version')!r}, "
                                      f"not {VERSION}")
            return {uid: PreparedClaim.from_json(uid, c) for uid, c in data["claims"].items()}
        except CheckpointError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{self.path}: malformed: {exc!r}") from None

    def get(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(uid)

    def claims(self) -> list[PreparedClaim]:
        with self._lock:
            return list(self._claims.values())

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.uid] = claim
            self._write()

    def drop(self, uid: str) -> None:
        with self._lock:
            if self._claims.pop(uid, None) is not None:
                self._write()

    def _write(self) -> None:
        write_atomically(self.path, json.dumps({"version": VERSION, "claims": {
            uid: c.to_json() for uid, c in sorted(self._claims.items())}}, indent=1))
