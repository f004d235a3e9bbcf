"""MIG on demand's partitionable devices (:mod:`tessera.dra.partitions`) against the real
kube-scheduler: an empty on-demand H100 published as one device per placement, all drawing
on the GPU's shared counters (KEP-4815), in the pool layout
:func:`tessera.dra.slices.plan` writes (counters in a slice of their own).

What it shows: the scheduler allocates claims for three profiles to placements the planner
accepts together, never two that overlap; a fourth that no longer fits stays unallocated
with the scheduler's reason; released, a placement is allocatable again exactly when the
planner says the profile fits; and the memory-slice counters alone keep a claim out (two
3g.40gb take every slice with a compute slice to spare: a 1g.10gb waits). On 1.34
(``DRAPartitionableDevices`` alpha, off) the API server drops the counters silently: the
read-back reports it, which is why on-demand GPUs need 1.36 or later. The node is an API
object without a kubelet (its pods stay bound, their claims allocated): this is the
scheduler's half; creating the instances is the node's."""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import pytest

from tessera.api.inventory import GPUInventory
from tessera.api.names import DRA_ATTRIBUTE_MIG_PROFILE, DRA_DRIVER
from tessera.dra.partitions import gpu_partitions
from tessera.dra.slices import dropped, plan
from tessera.mig.planner import Instance, LayoutError, validate
from tessera_e2e.chart import helm
from tessera_e2e.controlplane.build import ensure_helm
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.cluster import server_minor as cluster_server_minor
from tessera_e2e.operator.api_nodes import ApiGPUNodes
from tessera_e2e.operator.replicas import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

H100 = "H100-80GB"
MIG_CLASS = f"mig.{DRA_DRIVER}"
WAIT_S = 60.0


def _json(cluster: LocalCluster, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _create(cluster: LocalCluster, obj: dict[str, Any], ns: str | None = None) -> None:
    out = cluster.kubectl("create", *(["-n", ns] if ns else []), "-f", "-",
                          input=json.dumps(obj))
    assert out.returncode == 0, out.stderr


def _claim_and_pod(cluster: LocalCluster, ns: str, name: str, profile: str, node: str) -> None:
    _create(cluster, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": MIG_CLASS, "selectors": [{"cel": {"expression": (
                f'device.attributes["{DRA_DRIVER}"].{DRA_ATTRIBUTE_MIG_PROFILE} '
                f'== "{profile}"')}}]}}]}}}, ns)
    _create(cluster, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                 "tolerations": [{"operator": "Exists"}],
                 "resourceClaims": [{"name": "mig", "resourceClaimName": name}],
                 "containers": [{"name": "app", "image": "app:1",
                                 "resources": {"claims": [{"name": "mig"}]}}]}}, ns)


def _allocated(cluster: LocalCluster, ns: str, name: str) -> str | None:
    """The device the claim was allocated, None while it is not."""
    claim = _json(cluster, "get", "resourceclaim", name, "-n", ns)
    results = ((claim.get("status") or {}).get("allocation") or {}).get(
        "devices", {}).get("results") or []
    return str(results[0]["device"]) if results else None


def _unschedulable(cluster: LocalCluster, ns: str, pod: str) -> str | None:
    conds = (_json(cluster, "get", "pod", pod, "-n", ns).get("status") or {}).get(
        "conditions") or []
    return next((str(c.get("message", "")) for c in conds if c["type"] == "PodScheduled"
                 and c["status"] == "False" and c.get("reason") == "Unschedulable"), None)


def _release(cluster: LocalCluster, ns: str, name: str) -> None:
    """The pod gone (no kubelet to end it gracefully), then its claim (deallocated)."""
    out = cluster.kubectl("delete", "pod", name, "-n", ns, "--grace-period=0", "--force")
    assert out.returncode == 0, out.stderr
    out = cluster.kubectl("delete", "resourceclaim", name, "-n", ns, "--timeout=60s")
    assert out.returncode == 0, out.stderr


def test_the_scheduler_allocates_only_placements_the_planner_accepts_together(
        cluster: LocalCluster, namespace: str) -> None:
    try:
        binary = ensure_helm()
    except Exception as exc:  # no helm: fail, never skip
        pytest.fail(f"helm unavailable: {exc}")
    classes = [d for d in helm.template(binary, "ts", {"nodeDaemon": {"dra": {
        "nodeLabels": {"p": "dra"}}}}) if d["kind"] == "DeviceClass"]
    with ApiGPUNodes(str(cluster.kubeconfig), 1, gpus=1, prefix="ondemand-") as nodes:
        node = nodes.names[0]
        gpu = GPUInventory(index=0, uuid=f"GPU-{node}-0", model=H100, memory_mib=81559,
                           mig_mode="enabled")
        parts = gpu_partitions(gpu, occupied=[])
        devices = {d["name"]: d for d in parts.devices}
        written = plan(node, parts.devices, [], [parts.counter_set])
        made: list[str] = []
        try:
            for c in classes:
                out = cluster.kubectl("create", "-f", "-", input=json.dumps(c))
                assert out.returncode == 0 or "AlreadyExists" in out.stderr, out.stderr
                if out.returncode == 0:
                    made.append(c["metadata"]["name"])
            for obj in written.create:
                _create(cluster, obj)
            held = _json(cluster, "get", "resourceslices", "--field-selector",
                         f"spec.nodeName={node}")["items"]
            lost = dropped(parts.devices, [d for s in held for d in s["spec"].get("devices")
                                           or []])
            counters = [c for s in held for c in s["spec"].get("sharedCounters") or []]
            if cluster_server_minor(cluster.kubectl) < 36:
                # DRAPartitionableDevices off: both halves dropped without an error; the
                # scheduler would allocate overlapping placements, so tessera publishes no
                # on-demand GPU there
                assert lost == ["consumesCounters"] and counters == [], (lost, counters)
                return
            assert lost == [] and counters == [parts.counter_set], (lost, counters)

            # three profiles at once: three placements, valid together
            wanted = {"big": "3g.40gb", "mid": "2g.20gb", "small": "1g.10gb"}
            for name, profile in wanted.items():
                _claim_and_pod(cluster, namespace, name, profile, node)
            got = {name: wait_until(f"claim {name} allocated",
                                    partial(_allocated, cluster, namespace, name), WAIT_S)
                   for name in wanted}
            placed = {name: Instance(devices[d]["attributes"][DRA_ATTRIBUTE_MIG_PROFILE][
                "string"], devices[d]["attributes"]["start"]["int"]) for name, d in got.items()}
            assert {n: i.profile for n, i in placed.items()} == wanted, got
            validate(H100, list(placed.values()))  # no overlap, within the GPU

            # a fourth that no longer fits (4g.40gb: 4 compute slices, 1 left)
            _claim_and_pod(cluster, namespace, "whole-half", "4g.40gb", node)
            why = wait_until("the 4g.40gb pod unschedulable",
                             lambda: _unschedulable(cluster, namespace, "whole-half"), WAIT_S)
            assert "cannot allocate all claims" in why, why
            assert _allocated(cluster, namespace, "whole-half") is None

            # the 3g released: the 4g is allocated exactly when the planner says it fits
            _release(cluster, namespace, "big")
            rest = [placed["mid"], placed["small"]]
            try:
                validate(H100, [*rest, Instance("4g.40gb", 0)])
                fits = True
            except LayoutError:
                fits = False
            if fits:
                d = wait_until("the 4g.40gb claim allocated after the release",
                               lambda: _allocated(cluster, namespace, "whole-half"), WAIT_S)
                validate(H100, [*rest, Instance("4g.40gb",
                                                devices[d]["attributes"]["start"]["int"])])
            else:
                time.sleep(5)  # the scheduler retries a pod whose claims changed at once
                assert _allocated(cluster, namespace, "whole-half") is None
            for name in ("mid", "small", "whole-half"):
                _release(cluster, namespace, name)

            # the memory slices alone: two 3g.40gb take all eight, with one compute slice
            # left; a 1g.10gb waits for a slice, not for compute
            for name in ("left", "right"):
                _claim_and_pod(cluster, namespace, name, "3g.40gb", node)
            halves = [devices[wait_until(f"claim {n} allocated",
                                         partial(_allocated, cluster, namespace, n), WAIT_S)]
                      for n in ("left", "right")]
            assert sorted(d["attributes"]["start"]["int"] for d in halves) == [0, 4]
            _claim_and_pod(cluster, namespace, "one", "1g.10gb", node)
            why = wait_until("the 1g.10gb pod unschedulable",
                             lambda: _unschedulable(cluster, namespace, "one"), WAIT_S)
            assert "cannot allocate all claims" in why, why
            _release(cluster, namespace, "left")
            d = wait_until("the 1g.10gb claim allocated once a 3g.40gb is released",
                           lambda: _allocated(cluster, namespace, "one"), WAIT_S)
            right = next(h for h in halves if h["name"] == _allocated(cluster, namespace,
                                                                      "right"))
            validate(H100, [Instance("3g.40gb", right["attributes"]["start"]["int"]),
                            Instance("1g.10gb", devices[d]["attributes"]["start"]["int"])])
        finally:
            for name in ("big", "mid", "small", "whole-half", "left", "right", "one"):
                cluster.kubectl("delete", "pod", name, "-n", namespace, "--grace-period=0",
                                "--force", "--ignore-not-found")
            cluster.kubectl("delete", "resourceclaims", "--all", "-n", namespace,
                            "--wait=false")
            cluster.kubectl("delete", "resourceslices", "--field-selector",
                            f"spec.nodeName={node}")
            for name in made:
                cluster.kubectl("delete", "deviceclass", name, "--ignore-not-found")
