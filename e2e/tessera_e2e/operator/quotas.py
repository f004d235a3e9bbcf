"""Waiting for a GPUQuota to admit: a new quota admits no GPU pod until the operator has
counted it and the API server enforces the ResourceQuota it manages (docs/operator.md,
"GPUQuota status" and "Counting")."""

from __future__ import annotations

import json
from typing import Any

from tessera_e2e.operator.replicas import wait_until


def managed_rq(cluster: Any, ns: str, name: str = "team") -> dict[str, Any] | None:
    """The ResourceQuota GPUQuota ``name`` manages, if it exists."""
    out = cluster.kubectl("get", "resourcequota", f"gpuquota-{name}", "-n", ns, "-o", "json")
    return json.loads(out.stdout) if out.returncode == 0 else None


def enforced(cluster: Any, ns: str, name: str = "team") -> bool:
    """Whether the API server enforces the managed ResourceQuota (its quota controller has
    counted it: until then it refuses every pod asking for what it limits)."""
    rq = managed_rq(cluster, ns, name)
    return rq is not None and ((rq.get("status") or {}).get("hard") or {}) == (
        (rq.get("spec") or {}).get("hard") or {})


def counted(cluster: Any, ns: str, name: str = "team") -> bool:
    """Whether the operator has written the quota's ``status.used``."""
    out = cluster.kubectl("get", "gpuquota", name, "-n", ns, "-o", "json")
    return out.returncode == 0 and "used" in (json.loads(out.stdout).get("status") or {})


def wait_admitting(cluster: Any, ns: str, name: str = "team", timeout_s: float = 20) -> None:
    """Until the quota is counted and its ResourceQuota enforced."""
    wait_until(f"GPUQuota {ns}/{name} counted", lambda: counted(cluster, ns, name),
               timeout_s, 0.1)
    wait_until(f"the ResourceQuota of {ns}/{name} enforced",
               lambda: enforced(cluster, ns, name), timeout_s, 0.1)
