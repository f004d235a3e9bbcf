"""Kueue on a running test-bed cluster: start its manager for the length of a ``with`` block
(:func:`kueue_on`), apply and read objects, and what the tests ask of Kueue's objects (a
Job's Workload, its flavor, its evictions, a ClusterQueue's borrowing)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.kueue.manager import LocalKueue
from tessera_e2e.kueue.objects import condition
from tessera_e2e.operator.replicas import wait_until


def get_json(cluster: LocalCluster, *args: str) -> Any:
    """``kubectl get <args> -o json``, parsed; a failure raises AssertionError."""
    out = cluster.kubectl("get", *args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def apply(cluster: LocalCluster, docs: list[dict[str, Any]], *flags: str
          ) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", *flags, "-f", "-",
                           input="\n---\n".join(json.dumps(d) for d in docs))


@contextlib.contextmanager
def kueue_on(cluster: LocalCluster, binary: Path) -> Iterator[LocalKueue]:
    """Kueue's CRDs, RBAC and webhooks installed on the cluster and its manager running with
    the recipe's configuration; stopped on exit. Raises ControlPlaneError or TimeoutError
    when it does not start."""
    kueue = LocalKueue(cluster, binary).install().start()
    print(f"[kueue] manager ready {kueue.ready_seconds:.1f}s after its start")
    try:
        yield kueue
    finally:
        kueue.stop()


def wait_active(cluster: LocalCluster, queues: list[dict[str, Any]],
                timeout_s: float = 30) -> None:
    """Until each ClusterQueue and LocalQueue of ``queues`` is Active."""
    def active(*args: str) -> bool:
        return condition(get_json(cluster, *args), "Active") == "True"

    for q in queues:
        kind, meta = q["kind"].lower(), q["metadata"]
        where = ("-n", meta["namespace"]) if "namespace" in meta else ()
        wait_until(f"{q['kind']} {meta['name']} active",
                   partial(active, kind, meta["name"], *where), timeout_s)


def workloads_by_job(cluster: LocalCluster, namespace: str | None = None
                     ) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, Job) -> the Workload Kueue made for that Job (its owner), in one
    namespace or all, from one read."""
    where = ("-n", namespace) if namespace else ("-A",)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for w in get_json(cluster, "workloads", *where)["items"]:
        for owner in w["metadata"].get("ownerReferences") or []:
            if owner.get("kind") == "Job":
                out[(w["metadata"]["namespace"], owner["name"])] = w
    return out


def workload_of(cluster: LocalCluster, namespace: str, job: str) -> dict[str, Any] | None:
    """The Workload Kueue made for Job ``job``, if it exists yet."""
    return workloads_by_job(cluster, namespace).get((namespace, job))


def admitted(workload: Mapping[str, Any] | None) -> bool:
    """Admitted now or before it finished (Kueue keeps the condition on a finished one)."""
    return workload is not None and condition(workload, "Admitted") == "True"


def admitted_at(workload: Mapping[str, Any]) -> str:
    """When the workload was last admitted (RFC 3339, in seconds)."""
    for cond in (workload.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Admitted" and cond.get("status") == "True":
            return str(cond["lastTransitionTime"])
    raise ValueError(f"{workload['metadata']['name']} is not admitted")


def flavor_of(workload: Mapping[str, Any], resource: str) -> str:
    """The flavor the workload's (first) pod set was admitted with for ``resource``."""
    return str(workload["status"]["admission"]["podSetAssignments"][0]["flavors"][resource])


def evictions(workload: Mapping[str, Any], reason: str = "Preempted") -> int:
    """How many times Kueue evicted the workload for ``reason`` (its scheduling stats)."""
    stats = (workload.get("status") or {}).get("schedulingStats") or {}
    return sum(int(e.get("count", 0)) for e in stats.get("evictions") or []
               if e.get("reason") == reason)


def preemption_events(cluster: LocalCluster, namespace: str) -> dict[str, list[str]]:
    """Workload name -> the messages of Kueue's ``Preempted`` Events on it (they stay when
    the Workload is admitted again, its ``Preempted`` condition does not)."""
    out: dict[str, list[str]] = {}
    for e in get_json(cluster, "events", "-n", namespace, "--field-selector",
                      "involvedObject.kind=Workload,reason=Preempted")["items"]:
        out.setdefault(e["involvedObject"]["name"], []).extend(
            [e["message"]] * int(e.get("count") or 1))
    return out


def borrowed(cluster: LocalCluster, cq: str, flavor: str, resource: str) -> int:
    """What ClusterQueue ``cq`` borrows from its cohort now, of ``resource`` in ``flavor``."""
    status = get_json(cluster, "clusterqueue", cq).get("status") or {}
    for f in status.get("flavorsUsage") or []:
        if f["name"] == flavor:
            for r in f["resources"]:
                if r["name"] == resource:
                    return int(str(r.get("borrowed", "0")))
    return 0
