"""The kube-scheduler configuration that calls tessera's extender: one place, read by the
test bed's ``tessera-scheduler`` and checked against the chart's ConfigMap by a test.

``managedResources`` makes the scheduler call the extender only for pods asking for one of
tessera's device resources (``tessera.dev/vgpu`` or a ``tessera.dev/mig-<profile>`` of any
known model; the list cannot hold a wildcard). The scheduler still fits them against the
Node's totals first (``ignoredByScheduler: false``): a cheap pre-filter. The extender is
not ``ignorable``: when tessera cannot answer, pods stay Pending rather than being bound
blind. ``nodeCacheCapable`` sends node names, not Node objects (the extender has its own
watch). It answers filter (one node, reserved), bind (with the placement recorded) and
preempt; no prioritize: filter already chose by the node policy.
"""

from __future__ import annotations

import base64
from typing import Any

from tessera.api.names import PLACEMENT_PATH_PREFIX, SCHEDULER_NAME, VGPU
from tessera.api.resources import mig_resource_name
from tessera.mig.catalog import profiles
from tessera.models import MODELS

HTTP_TIMEOUT = "10s"
"""Longer than the default 5 s: a filter timeout fails the pod's scheduling cycle."""


def managed_resources() -> list[str]:
    names = {mig_resource_name(p.name) for m in MODELS if m.mig_capable
             for p in profiles(m.id)}
    return [VGPU, *sorted(names)]


def extender(url: str, ca_pem: bytes | None = None, ca_file: str | None = None
             ) -> dict[str, Any]:
    """The ``extenders[]`` entry for tessera at ``url`` (``https://host:port``)."""
    tls: dict[str, Any] = {}
    if ca_pem is not None:
        tls["caData"] = base64.b64encode(ca_pem).decode()
    if ca_file is not None:
        tls["caFile"] = ca_file
    return {
        "urlPrefix": f"{url.rstrip('/')}{PLACEMENT_PATH_PREFIX}",
        "filterVerb": "filter",
        "preemptVerb": "preempt",
        "bindVerb": "bind",
        "enableHTTPS": True,
        "tlsConfig": tls,
        "httpTimeout": HTTP_TIMEOUT,
        "nodeCacheCapable": True,
        "ignorable": False,
        "managedResources": [{"name": r, "ignoredByScheduler": False}
                             for r in managed_resources()],
    }


def scheduler_configuration(url: str, namespace: str, kubeconfig: str | None = None,
                            ca_pem: bytes | None = None, ca_file: str | None = None
                            ) -> dict[str, Any]:
    """A whole ``KubeSchedulerConfiguration`` with one profile, ``tessera-scheduler``,
    leader-elected on the Lease ``tessera-scheduler`` in ``namespace`` (tessera's)."""
    conf: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": True,
                           "resourceName": SCHEDULER_NAME,
                           "resourceNamespace": namespace},
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [extender(url, ca_pem, ca_file)],
    }
    if kubeconfig is not None:
        conf["clientConnection"] = {"kubeconfig": kubeconfig}
    return conf
