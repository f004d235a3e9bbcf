"""tessera's DRA kubelet plugin on the test bed's real 1.37 kubelet: a claim for 4 GiB and 30
cores of a shared GPU is allocated by the real scheduler (consumable capacity, beta and on by
default from 1.36: no feature gate is set), prepared by tessera-node (``--dra``) into a budget
file and a CDI spec that containerd applies, and the pod's container sees exactly that
budget; deleting the pod unprepares the claim and leaves none of its files. A restarted
kubelet registers the plugin again by itself, the daemon publishes the node's slice again
(the kubelet deletes it at its start) and claims are prepared as before.

The nodes' daemons run with ``--dra true --device-plugin false``: each publishes its node's
ResourceSlice itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import (
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_CLAIM_BUDGET,
    BUDGETED_CLAIMS,
    DRA_DRIVER,
    LABEL_BUDGETED,
)
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed, claim_pod, gpu_bed
from tessera_e2e.gpubed.daemons import KubeletNodeDaemon
from tessera_e2e.nodes.images import WORKLOAD
from tessera_e2e.nodes.node import GPU_DIR
from tessera_e2e.operator.replicas import render_chart, wait_until
from tessera_node.budget.formats import read_budget_file
from tessera_sim import SIM_DIR

pytestmark = [pytest.mark.integration]

NODE = "node-0"  # one H100-80GB, shared
GIB = 1 << 30
CLAIM = "gpu-share"


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed[KubeletNodeDaemon]]:
    with gpu_bed(node_cluster, tmp_path_factory.mktemp("tessera-dra"),
                 daemon_args=("--dra", "true", "--device-plugin", "false")) as b:
        # the chart's permissions with a DRA pool (the daemon's resourceslices rights and
        # the policy narrowing them to its node's), applied over the bed's chart
        text = render_chart(values={"nodeDaemon": {"dra": {"nodeLabels": {"pool": "dra"}}}})
        out = b.cluster.kubectl("apply", "-f", "-", input=text)
        assert out.returncode == 0, out.stderr
        out = b.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRA_DRIVER},
            "spec": {"selectors": [{"cel": {"expression":
                                            f'device.driver == "{DRA_DRIVER}"'}}]}}))
        assert out.returncode == 0, out.stderr
        try:
            yield b
        finally:
            b.kubectl("delete", "deviceclass", DRA_DRIVER, "--ignore-not-found")
    # once the daemons stopped (both ran --dra, and a running one publishes again at once):
    # leave no slice of tessera's behind
    node_cluster.kubectl("delete", "resourceslices", "--field-selector",
                         f"spec.driver={DRA_DRIVER}")


def node_slice(bed: Bed[KubeletNodeDaemon]) -> dict[str, Any] | None:
    """node-0's ResourceSlice of tessera's driver, once its daemon published it."""
    items = bed.get("resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
    mine = [s for s in items if s["spec"]["driver"] == DRA_DRIVER]
    return mine[0] if len(mine) == 1 and mine[0]["spec"].get("devices") else None


def run_claim(bed: Bed[KubeletNodeDaemon], namespace: str) -> None:
    """A claim for 4 GiB and 30 cores of node-0's GPU, a pod using it: the container sees
    exactly that budget; deleting the pod unprepares the claim and leaves none of its files."""
    daemon = bed.daemons[NODE]
    bed.cluster.wait_for_service_account(namespace)
    devices = wait_until(f"{NODE}'s slice, published by its daemon",
                         lambda: node_slice(bed), 60)["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu0"] and devices[0]["allowMultipleAllocations"]
    bed.apply(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": CLAIM},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRA_DRIVER,
            "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}}]}}})
    bed.apply(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra"},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": NODE},
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}],
                 "containers": [{
                     "name": "main", "image": WORKLOAD, "imagePullPolicy": "Never",
                     "command": ["sh", "-c", "cuda-info && cuda-alloc 4000 && "
                                 "cuda-alloc 4100; sleep 3600"],
                     "resources": {"claims": [{"name": "gpu"}]}}]}})
    try:
        pod = bed.wait_phase(namespace, "dra", {"Running", "Failed", "Succeeded"}, 120)
        claim = bed.get("resourceclaim", "-n", namespace, CLAIM)
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRA_DRIVER, NODE,
                                                                        "gpu0")
        assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}, result
        logs = wait_until("the container's output", lambda: (
            out if "cuda-alloc" in (out := bed.logs(namespace, "dra")) else None), 60)
        assert pod["status"]["phase"] == "Running", (pod["status"], logs)
        lines = logs.splitlines()
        # the container sees its one unit with the claim's memory as its total, all free
        assert "devices 1" in lines, logs
        gpu_line = next(line for line in lines if line.startswith("0 "))
        assert gpu_line.split()[-2:] == ["4096", "4096"], logs
        assert "allocated 4000" in lines, logs
        assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in lines, logs
        # the budget file the container reads: the claim's memory and cores
        state = daemon.state_dir / "claims" / uid
        (entry,) = read_budget_file(state / "budget").entries
        assert (entry.memory, entry.cores) == (4 * GIB, 30), entry
        spec = daemon.real.host_path(f"/run/cdi/{DRA_DRIVER}-claim-{uid}.json")  # /var/run/cdi
        assert spec.is_file()
        out = bed.kubectl("delete", "pod", "-n", namespace, "dra", "--wait=true")
        assert out.returncode == 0, out.stderr
        wait_until("the claim unprepared", lambda: not spec.exists() and not state.exists(),
                   90)
        checkpoint = json.loads((daemon.state_dir / "dra" / "checkpoint.json").read_text())
        assert uid not in checkpoint["claims"]
    finally:
        bed.kubectl("delete", "pod", "-n", namespace, "dra", "--ignore-not-found")
        bed.kubectl("delete", "resourceclaim", "-n", namespace, CLAIM, "--ignore-not-found")


def test_a_claim_for_part_of_a_gpu_runs_under_exactly_that_budget(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    daemon = bed.daemons[NODE]
    sockets = daemon.real.host_path("/var/lib/kubelet")
    assert (sockets / "plugins_registry" / f"{DRA_DRIVER}-reg.sock").is_socket()
    assert (sockets / "plugins" / DRA_DRIVER / "dra.sock").is_socket()
    assert daemon.get("/readyz")[0] == 200  # the kubelet took the plugin
    assert any(r.get("msg") == "registered with the kubelet" for r in daemon.log_records())
    run_claim(bed, node_namespace)


def test_a_restarted_kubelet_registers_the_plugin_again(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    daemon = bed.daemons[NODE]
    before = wait_until(f"{NODE}'s slice", lambda: node_slice(bed), 60)["metadata"]["uid"]
    restarted = time.time()
    bed.restart_kubelet(NODE, device_plugin=False)
    wait_until("the kubelet registering the DRA plugin again", lambda: any(
        r.get("msg") == "registered with the kubelet"
        for r in daemon.log_records(restarted)), 60)
    assert daemon.get("/readyz")[0] == 200
    # a starting kubelet deletes its node's ResourceSlices; the daemon publishes again
    wait_until("the node's slice deleted by the kubelet and published again", lambda: (
        s if (s := node_slice(bed)) and s["metadata"]["uid"] != before else None), 60)
    run_claim(bed, node_namespace)


def share_claim(name: str, memory: str, cores: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRA_DRIVER,
                "capacity": {"requests": {"memory": memory, "cores": str(cores)}}}}]}}}


def test_two_claims_split_one_gpu_by_their_cores_and_idle_time_is_lent(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """Claims of 4 GiB/30 % and 6 GiB/70 % land on node-0's one GPU; their pods saturate it
    and each gets its claim's share of the busy time (±3 points over 10 s), as the daemon's
    core controllers count it per pod; one goes idle and the other takes the GPU. The audit
    attributes both pods' processes to their claims: none is foreign."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    wait_until(f"{NODE}'s slice", lambda: node_slice(bed), 60)
    pause = "/tmp/pause"
    for name, memory, cores, seed in (("thirty", "4Gi", 30, 1), ("seventy", "6Gi", 70, 2)):
        bed.apply(ns, share_claim(name, memory, cores))
        bed.apply(ns, claim_pod(name, claim=name, command=f"cuda-spin 0 1000 {seed} {pause}"))
    try:
        for name in ("thirty", "seventy"):
            bed.wait_phase(ns, name, {"Running"}, 120)
        devices = {name: bed.get("resourceclaim", "-n", ns, name)["status"]["allocation"][
            "devices"]["results"][0]["device"] for name in ("thirty", "seventy")}
        assert devices == {"thirty": "gpu0", "seventy": "gpu0"}, devices
        wait_until("both claims under a core controller", lambda: len(
            bed.core_busy(NODE, ns)) == 2, 60, 1)
        time.sleep(3)  # the controller learns the kernels' cost
        got, wall = bed.busy_window(NODE, ns, 10)
        total = sum(got.values())
        shares = {p: round(100 * v / total, 2) for p, v in got.items()}
        print(f"claims' achieved shares over 10 s: {shares}, GPU busy {total / wall:.3f}")
        assert total <= 1.03 * wall, (got, wall)
        assert abs(shares["thirty"] - 30) <= 3 and abs(shares["seventy"] - 70) <= 3, shares

        out = bed.kubectl("exec", "-n", ns, "thirty", "--", "sh", "-c", f": > {pause}")
        assert out.returncode == 0, out.stderr
        time.sleep(2)
        got, wall = bed.busy_window(NODE, ns, 3)
        assert got["thirty"] / wall < 0.02, got
        assert got["seventy"] / wall >= 0.90, (got, wall)
        print(f"lending: seventy busy {got['seventy'] / wall:.3f} while thirty idles")
        # the audit saw both pods' processes as their claims' (no ForeignGPUProcess Event)
        foreign = bed.kubectl("get", "events", "-A", "--field-selector",
                              "reason=ForeignGPUProcess", "-o", "name")
        assert foreign.returncode == 0 and foreign.stdout.strip() == "", foreign.stdout
    finally:
        for name in ("thirty", "seventy"):
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
            bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--ignore-not-found")


def unschedulable(bed: Bed[KubeletNodeDaemon], namespace: str, pod: str) -> str:
    """The scheduler's reason for not placing the pod, once it gave one (60 s at most)."""
    return wait_until(f"{pod}'s scheduling failure", lambda: next((
        c["message"] for c in (bed.get("pod", "-n", namespace, pod).get("status") or {})
        .get("conditions") or [] if c["type"] == "PodScheduled"
        and c["status"] == "False" and c.get("message")), None), 60)


def seen_memory_mib(bed: Bed[KubeletNodeDaemon], namespace: str, pod: str) -> int:
    """The total GPU memory the pod's container sees (cuda-info's line for device 0)."""
    logs = wait_until(f"{pod}'s cuda-info", lambda: (
        out if "devices 1" in (out := bed.logs(namespace, pod)) else None), 60)
    return int(next(line for line in logs.splitlines() if line.startswith("0 ")).split()[-2])


@pytest.mark.oldest_kubernetes
def test_two_claims_get_what_the_release_can_allocate_and_nothing_more(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """Two claims of 4 GiB/30 % for node-0's one GPU. From 1.36 (consumable capacity on by
    default) both run on it, each container held to 4 GiB. On 1.34 (off) the API server
    drops the claim's capacity request and the device's allowMultipleAllocations: the first
    claim gets the GPU exclusively, and its container the whole GPU's memory; the second
    stays Pending with the scheduler's reason. Neither release overcommits the GPU."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    wait_until(f"{NODE}'s slice", lambda: node_slice(bed), 60)
    minor = bed.cluster.server_minor()
    try:
        bed.apply(ns, share_claim("first", "4Gi", 30))
        bed.apply(ns, claim_pod("first", claim="first", command="cuda-info; sleep 3600"))
        bed.wait_phase(ns, "first", {"Running"}, 120)
        bed.apply(ns, share_claim("second", "4Gi", 30))
        bed.apply(ns, claim_pod("second", claim="second", command="cuda-info; sleep 3600"))
        if minor >= 36:
            bed.wait_phase(ns, "second", {"Running"}, 120)
            assert [seen_memory_mib(bed, ns, p) for p in ("first", "second")] == [4096, 4096]
            print(f"[figures] 1.{minor}: two 4 GiB claims share gpu0, each sees 4096 MiB")
            return
        stored = bed.get("resourceclaim", "-n", ns, "first")
        assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"], stored
        (result,) = stored["status"]["allocation"]["devices"]["results"]
        assert "consumedCapacity" not in result, result  # allocated exclusively
        whole = int(node_slice(bed)["spec"]["devices"][0]["attributes"]["memoryMiB"]["int"])
        assert seen_memory_mib(bed, ns, "first") == whole
        reason = unschedulable(bed, ns, "second")
        assert "claim" in reason.lower(), reason
        assert bed.get("pod", "-n", ns, "second")["status"]["phase"] == "Pending"
        print(f"[figures] 1.{minor}: the first claim takes gpu0 whole ({whole} MiB seen), "
              f"the second Pending: {reason}")
    finally:
        for name in ("first", "second"):
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
            bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--ignore-not-found")


def template(name: str, memory: str, cores: int, cel: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": DRA_DRIVER,
                            "capacity": {"requests": {"memory": memory, "cores": str(cores)}}}
    if cel:
        body["selectors"] = [{"cel": {"expression": cel}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}}}


def test_ten_claims_at_once_all_run_on_gpus_with_room_and_survive_a_daemon_restart(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """Ten claims of 6000 MiB made at once (one per pod, from templates; one selects the
    A100 by CEL): all run, none refused, and no GPU's claims add up to more than it has.
    A claim for more than any GPU has left stays Pending with the scheduler's reason, though
    the GPUs together have room for it. node-0's tessera-node is stopped and started again
    under its running claims: they stay prepared with the same budget files, their
    containers keep their budgets, and the restarted daemon prepares a new claim."""
    from tessera.api.quantity import to_bytes

    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    wait_until(f"{NODE}'s slice", lambda: node_slice(bed), 60)
    bed.apply(ns, template("six-gi", "6000Mi", 10))
    bed.apply(ns, template("six-gi-a100", "6000Mi", 10,
                           f'device.attributes["{DRA_DRIVER}"].model == "A100-40GB"'))
    names = [f"w{i}" for i in range(10)]
    for i, name in enumerate(names):  # all at once: nothing waits for the one before
        bed.apply(ns, claim_pod(name, "cuda-info; sleep 3600", node=None,
                                  template="six-gi-a100" if i == 0 else "six-gi"))
    try:
        for name in names:
            bed.wait_phase(ns, name, {"Running"}, 180)
        slices = [s for s in bed.get("resourceslices")["items"]
                  if s["spec"]["driver"] == DRA_DRIVER]
        capacity = {(s["spec"]["pool"]["name"], d["name"]):
                    to_bytes(d["capacity"]["memory"]["value"])
                    for s in slices for d in s["spec"]["devices"]}
        taken: dict[tuple[str, str], int] = {}
        by_pod: dict[str, tuple[str, str]] = {}
        for c in bed.get("resourceclaims", "-n", ns)["items"]:
            (r,) = c["status"]["allocation"]["devices"]["results"]
            where = (r["pool"], r["device"])
            taken[where] = taken.get(where, 0) + to_bytes(r["consumedCapacity"]["memory"])
            by_pod[c["status"]["reservedFor"][0]["name"]] = where
        assert sorted(by_pod) == names
        assert by_pod["w0"][0] == "node-1"  # the A100, chosen by its model
        assert all(taken[w] <= capacity[w] for w in taken), (taken, capacity)
        free = {w: capacity[w] - taken.get(w, 0) for w in capacity}
        print(f"[figures] ten 6000 MiB claims: {sorted(taken.items())}; free "
              f"{ {w: f // (1 << 20) for w, f in free.items()} } MiB")
        # more than any GPU has left, less than they have together: no unit holds it
        big = (max(free.values()) >> 20) + 1000
        assert big << 20 <= sum(free.values())
        bed.apply(ns, template("big", f"{big}Mi", 10))
        bed.apply(ns, claim_pod("big", "cuda-info; sleep 3600", template="big", node=None))
        reason = unschedulable(bed, ns, "big")
        assert "claim" in reason.lower(), reason
        print(f"[figures] a {big} MiB claim: Pending: {reason}")
        bed.kubectl("delete", "pod", "-n", ns, "big", "--wait=true")

        daemon = bed.daemons[NODE]
        mine = [n for n, w in by_pod.items() if w[0] == NODE]
        state = daemon.state_dir / "claims"
        before = {p.parent.name: p.stat().st_ino for p in state.glob("*/budget")}
        assert len(before) == len(mine), (before, mine)
        daemon.restart()
        assert {p.parent.name: p.stat().st_ino for p in state.glob("*/budget")} == before
        checkpoint = json.loads((daemon.state_dir / "dra" / "checkpoint.json").read_text())
        assert set(checkpoint["claims"]) == set(before)
        for name in mine:  # the container's budget, read again after the restart
            out = bed.kubectl("exec", "-n", ns, name, "--", "cuda-info")
            assert out.returncode == 0 and any(
                line.startswith("0 ") and line.split()[-2] == "6000"
                for line in out.stdout.splitlines()), out.stdout
        bed.apply(ns, claim_pod("after", "cuda-info; sleep 3600", template="six-gi", node=None))
        bed.wait_phase(ns, "after", {"Running"}, 120)
    finally:
        for name in [*names, "big", "after"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        for name in [*names, "big", "after"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")


def device_capacity(bed: Bed[KubeletNodeDaemon], node: str) -> tuple[int, int]:
    """(memory MiB, cores) the node's one device publishes now."""
    from tessera.api.quantity import to_bytes

    items = bed.get("resourceslices", "--field-selector", f"spec.nodeName={node}")["items"]
    (device,) = [d for s in items if s["spec"]["driver"] == DRA_DRIVER
                 for d in s["spec"].get("devices") or []]
    cap = device["capacity"]
    return to_bytes(cap["memory"]["value"]) >> 20, int(cap["cores"]["value"])


def test_a_running_claims_budget_is_resized_and_no_claim_is_placed_into_its_growth(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """On node-1 (one A100, 40960 MiB) a pod's claim from a template takes 4 GiB and 30 %
    cores; its process cannot allocate 6000 MiB. `tessera resize` to 30 GiB / 40 % while it
    runs: Applied, an Event, the claim's budget file, the GPUQuota counting the growth, and
    node-1's device publishing 26 GiB and 10 cores less, so a new claim for 12 GiB that the
    GPU had room for before stays Pending; the same process then allocates 6000 MiB. A
    restarted daemon keeps both the budget and the capacity withheld. Shrunk to 2 GiB: the
    capacity comes back and the 12 GiB claim runs. Grown again past what the GPU holds
    beside it: refused by the node, the operator restores the previous budget, the file is
    untouched. The pod gone, the device publishes all of its capacity again."""
    ns = node_namespace
    node = "node-1"
    go = "/tmp/go"
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, {"memory": "64Gi", "cores": 400, "pods": 10}, {"memory": "40Gi", "cores": 100})
    wait_until(f"{node}'s slice", lambda: device_capacity(bed, node), 60)
    assert device_capacity(bed, node) == (40960, 100)
    a100 = f'device.attributes["{DRA_DRIVER}"].model == "A100-40GB"'
    bed.apply(ns, template("four", "4Gi", 30, a100))
    bed.apply(ns, template("twelve", "12Gi", 10, a100))
    bed.apply(ns, claim_pod("grower", f"cuda-alloc 6000; echo before $?; "
                                      f"while [ ! -e {go} ]; do sleep 0.2; done; "
                                      f"cuda-alloc 6000; echo after $?; sleep 3600",
                            template="four", node=node))
    try:
        pod = bed.wait_phase(ns, "grower", {"Running"}, 120)
        wait_until("grower refused past its claim", lambda: "before 1" in bed.logs(ns, "grower"),
                   60)
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = bed.get("resourceclaim", "-n", ns, status["resourceClaimName"])
        uid = claim["metadata"]["uid"]
        budget = bed.daemons[node].state_dir / "claims" / uid / "budget"
        # the leader labels the claim's pod, so its pod watch answers the resize
        wait_until("grower labelled as a pod of claims", lambda: bed.pod(ns, "grower")[
            "metadata"].get("labels", {}).get(LABEL_BUDGETED) == BUDGETED_CLAIMS, 30, 0.5)

        started = time.monotonic()
        r = bed.resize(ns, "grower", "--memory", "30Gi", "--cores", "40")
        took = time.monotonic() - started
        assert r.returncode == 0, (r.stdout, r.stderr)
        ann = bed.pod(ns, "grower")["metadata"]["annotations"]
        assert json.loads(ann[ANNOTATION_BUDGET_RESIZE])["state"] == "Applied", ann
        assert json.loads(ann[ANNOTATION_CLAIM_BUDGET])[uid] == {
            "claim": claim["metadata"]["name"], "memoryMiB": 30720, "cores": 40,
            "allocatedMemoryMiB": 4096, "allocatedCores": 30}, ann
        (entry,) = read_budget_file(budget).entries
        assert (entry.memory, entry.cores) == (30 * GIB, 40), entry
        wait_until("the BudgetResized Event (posted after the patch)", lambda: any(
            "30720 MiB, 40% cores" in m for m in bed.events(ns, "grower", "BudgetResized")),
            30, 0.5)
        assert device_capacity(bed, node) == (40960 - 26624, 90)
        # per claim: its containers' series join the claim's info series
        wait_until("the claim's info series", lambda: bed.daemons[node].metric(
            "tessera_claim_info", namespace=ns, pod="grower", container="main",
            claim=claim["metadata"]["name"]) == 1, 30, 0.5)
        wait_until("the GPUQuota counting the claim and its growth", lambda: bed.get(
            "gpuquota", "-n", ns, "team").get("status", {}).get("used", {}).get(
            "memory") == "30Gi", 30, 0.5)
        print(f"[figures] DRA resize 4Gi/30 -> 30Gi/40 applied in {took:.2f}s (tessera resize, "
              f"through the operator and node-1); node-1 publishes {device_capacity(bed, node)}")

        # the scheduler keeps out of the growth: 12 GiB fitted beside 4 GiB, not beside 30
        bed.apply(ns, claim_pod("twelve", "cuda-info; sleep 3600", template="twelve", node=None))
        reason = unschedulable(bed, ns, "twelve")
        assert "claim" in reason.lower(), reason
        exec_sh = bed.kubectl("exec", "-n", ns, "grower", "--", "sh", "-c", f": > {go}")
        assert exec_sh.returncode == 0, exec_sh.stderr
        wait_until("the same process allocating 6000 MiB", lambda: "after 0" in bed.logs(
            ns, "grower"), 60)
        assert bed.get("pod", "-n", ns, "twelve")["status"]["phase"] == "Pending"

        bed.daemons[node].restart()  # the budget and the withheld capacity stay
        assert device_capacity(bed, node) == (40960 - 26624, 90)
        (entry,) = read_budget_file(budget).entries
        assert (entry.memory, entry.cores) == (30 * GIB, 40), entry

        r = bed.resize(ns, "grower", "--memory", "2Gi")  # a shrink: the capacity returns
        assert r.returncode == 0, (r.stdout, r.stderr)
        (entry,) = read_budget_file(budget).entries
        assert (entry.memory, entry.cores) == (2 * GIB, 40), entry
        wait_until("node-1's capacity back", lambda: device_capacity(bed, node) == (40960, 90),
                   30, 0.5)
        bed.wait_phase(ns, "twelve", {"Running"}, 120)

        # 30 GiB again does not fit beside the 12 GiB claim: the node refuses, the operator
        # restores the previous budget, the file and the capacity stay
        r = bed.resize(ns, "grower", "--memory", "30Gi")
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "on this node: claims allocated on GPU-" in r.stderr, r.stderr
        wait_until("grower's previous budget restored", lambda: json.loads(
            bed.pod(ns, "grower")["metadata"]["annotations"][ANNOTATION_CLAIM_BUDGET]
        )[uid]["memoryMiB"] == 2048, 30, 0.5)
        (entry,) = read_budget_file(budget).entries
        assert (entry.memory, entry.cores) == (2 * GIB, 40), entry
        wait_until("node-1's capacity as before the refused resize",
                   lambda: device_capacity(bed, node) == (40960, 90), 30, 0.5)
        r = bed.resize(ns, "grower", "--memory", "41Gi")  # over the quota's per-pod max
        assert r.returncode == 1 and 'max 40Gi' in r.stderr, (r.stdout, r.stderr)
    finally:
        for name in ("grower", "twelve"):
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
    wait_until("node-1's whole capacity published again", lambda: device_capacity(
        bed, node) == (40960, 100), 60, 0.5)


ON_DEMAND = "on-demand-node-0"


def partition_entry(bed: Bed[KubeletNodeDaemon]) -> Any:
    """node-0's report of the on-demand partition (a NodePartitionStatus), if any."""
    from tessera.api.names import ANNOTATION_PARTITION_STATUS
    from tessera.api.node_report import parse_reports

    raw = (bed.get("node", NODE)["metadata"].get("annotations") or {}).get(
        ANNOTATION_PARTITION_STATUS)
    return parse_reports(raw).get(ON_DEMAND) if raw else None


def partition_phase(bed: Bed[KubeletNodeDaemon], generation: int) -> str | None:
    """node-0's report of the on-demand partition at ``generation`` (its phase)."""
    entry = partition_entry(bed)
    if entry is None or entry.observed_generation != generation:
        return None
    return str(entry.phase)


def instance_claims(bed: Bed[KubeletNodeDaemon]) -> dict[tuple[str, int], str | None]:
    """(profile, start) -> the claim the report says the instance was made for."""
    entry = partition_entry(bed)
    return {(i.profile, i.start): i.claim for g in (entry.gpus if entry else [])
            for i in g.instances}


def on_demand_partition(bed: Bed[KubeletNodeDaemon], layout: dict[str, Any]) -> int:
    out = bed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
        "metadata": {"name": ON_DEMAND},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}},
                 "layout": layout}}))
    assert out.returncode == 0, out.stderr
    return int(bed.get("gpupartition", ON_DEMAND)["metadata"]["generation"])


def published(bed: Bed[KubeletNodeDaemon], device: str) -> bool:
    """node-0's slices publish ``device`` now."""
    return any(d["name"] == device for s in bed.get(
        "resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
        for d in s["spec"].get("devices") or [])


def put_on_demand(bed: Bed[KubeletNodeDaemon]) -> None:
    """node-0's GPU in migMode OnDemand, its placements published."""
    gen = on_demand_partition(bed, {"migMode": "OnDemand"})
    wait_until("node-0's GPU on demand", lambda: partition_phase(bed, gen) == "Ready", 90)
    wait_until("node-0's placements published",
               lambda: published(bed, "gpu0-mig0-7g80gb"), 60)


def put_whole(bed: Bed[KubeletNodeDaemon]) -> None:
    """node-0's GPU back to MIG disabled and published whole (for the tests after)."""
    gen = on_demand_partition(bed, {"migMode": "Disabled"})
    wait_until("node-0's GPU whole again", lambda: partition_phase(bed, gen) == "Ready", 90)
    bed.kubectl("delete", "gpupartition", ON_DEMAND, "--ignore-not-found")
    wait_until("node-0's whole GPU published again", lambda: node_slice(bed), 60)


def profile_claim(name: str, profile: str | None = None, memory_mib: int | None = None,
                  budget: str | None = None) -> dict[str, Any]:
    """A claim for one MIG instance: of ``profile``, or of at least ``memory_mib``; with
    ``budget``, a memory budget inside it (``capacity.requests``)."""
    attrs = f'device.attributes["{DRA_DRIVER}"]'
    cel = (f'{attrs}.migProfile == "{profile}"' if profile is not None
           else f"{attrs}.mig == true && {attrs}.memoryMiB >= {memory_mib}")
    body: dict[str, Any] = {"deviceClassName": DRA_DRIVER,
                            "selectors": [{"cel": {"expression": cel}}]}
    if budget is not None:
        body["capacity"] = {"requests": {"memory": budget}}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}}


def test_claims_on_an_on_demand_gpu_get_instances_made_and_destroyed_for_them(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """node-0's H100 in migMode OnDemand: three claims of different profiles (one by
    memory: the smallest profile holding it, with a 4 GiB budget inside) get three
    instances made at the placements the scheduler allocated (valid together), each
    container sees its instance (or its budget); a 4g.40gb that no longer fits stays
    Pending with the scheduler's reason; a released claim's instance is destroyed while
    its neighbours keep running. Afterwards the GPU goes back to MIG disabled (for the
    tests after)."""
    from tessera.mig.catalog import profile as mig_profile
    from tessera.mig.planner import Instance, validate

    ns, daemon = node_namespace, bed.daemons[NODE]
    # "small" asks 15000 MiB of any instance: the smallest profile holding it (the
    # placements are published smallest first) is a 1g.20gb; it keeps a 4 GiB budget there
    pods = {"big": "3g.40gb", "mid": "2g.20gb", "small": "1g.20gb"}
    claims = {"big": profile_claim("big", "3g.40gb"), "mid": profile_claim("mid", "2g.20gb"),
              "small": profile_claim("small", memory_mib=15000, budget="4Gi")}
    try:
        put_on_demand(bed)
        created = time.monotonic()
        for name in pods:
            bed.apply(ns, claims[name])
            bed.apply(ns, claim_pod(name, claim=name, command="cuda-info; sleep 3600"))
        for name in pods:
            bed.wait_phase(ns, name, {"Running"}, 120)
        running_s = time.monotonic() - created
        placed = {}
        for name, prof in pods.items():
            (r,) = bed.get("resourceclaim", "-n", ns, name)["status"]["allocation"][
                "devices"]["results"]
            start = int(r["device"].split("-mig")[1].split("-")[0])
            placed[name] = Instance(prof, start)
            assert r["device"] == f"gpu0-mig{start}-{prof.replace('.', '')}", r
            seen = mig_profile("H100-80GB", prof).memory_mib if name != "small" else 4096
            assert seen_memory_mib(bed, ns, name) == seen, name
        validate("H100-80GB", list(placed.values()))
        lgi = daemon.smi("mig", "-lgi").stdout
        for inst in placed.values():  # made where the scheduler allocated them
            shown = rf"MIG {re.escape(inst.profile)}\s+\d+\s+\d+\s+{inst.start}:"
            assert re.search(shown, lgi), lgi
        print(f"[figures] on demand: three claims (3g.40gb, 2g.20gb, >=15000 MiB) running "
              f"{running_s:.1f}s after they were made, instances at "
              f"{ {n: i.start for n, i in placed.items()} }; instance made in "
              f"{daemon.metric('tessera_node_mig_on_demand_seconds_sum') or 0:.2f}s in all")
        assert daemon.metric("tessera_node_mig_on_demand_total", action="create",
                             result="ok") == 3
        # the partition's status (node-0's report) names each instance's claim
        mine = {(i.profile, i.start): f"{ns}/{n}" for n, i in placed.items()}
        wait_until("the report naming the claims", lambda: instance_claims(bed) == mine, 30)
        bed.apply(ns, profile_claim("half", "4g.40gb"))
        bed.apply(ns, claim_pod("half", claim="half", command="cuda-info; sleep 3600"))
        reason = unschedulable(bed, ns, "half")
        assert "cannot allocate all claims" in reason, reason
        bed.kubectl("delete", "pod", "-n", ns, "half", "--wait=true")
        # released: its instance destroyed, the neighbours' containers untouched
        out = bed.kubectl("delete", "pod", "-n", ns, "small", "--wait=true")
        assert out.returncode == 0, out.stderr
        bed.kubectl("delete", "resourceclaim", "-n", ns, "small", "--wait=true")
        wait_until("the 1g.20gb instance destroyed", lambda: "1g.20gb" not in daemon.smi(
            "mig", "-lgi").stdout, 60)
        assert daemon.metric("tessera_node_mig_on_demand_total", action="destroy",
                             result="ok") == 1
        for name in ("big", "mid"):
            bed.assert_untouched(ns, name)
    finally:
        for name in [*pods, "half"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        for name in [*pods, "half"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
            bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--ignore-not-found")
        put_whole(bed)


CREATE_CI = "nvmlGpuInstanceCreateComputeInstance"
"""The NVML call ``nvidia-smi mig -cgi … -C`` makes the compute instance with, after the GPU
instance (``-cci`` without a placement uses it too)."""
GI_ROW = re.compile(r"^\|\s+0\s+MIG (\S+)\s+\d+\s+(\d+)\s+(\d+):\d+\s+\|$")
CI_ROW = re.compile(r"^\|\s+0\s+(\d+)\s+MIG \S+\s+\d+\s+\d+\s+\d+:\d+\s+\|$")


def gpu_instances(daemon: KubeletNodeDaemon) -> list[tuple[str, int, int]]:
    """(profile, start, GPU instance ID) of each GPU instance of node-0's GPU 0, as
    ``nvidia-smi mig -lgi`` lists them."""
    out = daemon.smi("mig", "-i", "0", "-lgi").stdout
    rows = [(m[1], int(m[3]), int(m[2])) for line in out.splitlines()
            if (m := GI_ROW.match(line.strip()))]
    assert rows or "No GPU instances found" in out, out  # a table or none: never an error
    return rows


def compute_instances(daemon: KubeletNodeDaemon) -> list[int]:
    """The GPU instance ID of each compute instance of node-0's GPU 0 (``-lci``)."""
    out = daemon.smi("mig", "-i", "0", "-lci").stdout
    rows = [int(m[1]) for line in out.splitlines() if (m := CI_ROW.match(line.strip()))]
    assert rows or "No compute instances found" in out, out
    return rows


def node_fault(daemon: KubeletNodeDaemon, fn: str, count: int, delay_us: int = 0
               ) -> subprocess.CompletedProcess[str]:
    """The simulator's fault table of node-0's GPUs, set from inside the node as
    ``python -m tessera_sim fault`` (every NVML process of the node reads it, the daemon's
    nvidia-smi too): the next ``count`` calls of ``fn`` only slow, by ``delay_us``; count 0
    clears it."""
    return subprocess.run(
        [*daemon.real.nsenter("-m"), "env", f"TESSERA_SIM_NODE={GPU_DIR}/node.conf",
         f"PYTHONPATH={SIM_DIR}", sys.executable, "-m", "tessera_sim", "fault", "--fn", fn,
         "--count", str(count), "--code", "0", "--delay-us", str(delay_us)],
        capture_output=True, text=True, timeout=60)


def child_processes(pid: int, comm: str) -> list[int]:
    """The live processes named ``comm`` whose parent is ``pid``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        state, ppid = stat[stat.rindex(")") + 2:].split()[:2]
        if stat[stat.index("(") + 1:stat.rindex(")")] == comm and int(ppid) == pid \
                and state != "Z":
            found.append(int(proc.name))
    return found


def gone(pid: int) -> bool:
    """The process exited (a zombie counts: it runs nothing any more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2:].split()[0] == "Z"


def allocated_device(bed: Bed[KubeletNodeDaemon], namespace: str, claim: str) -> str | None:
    """The device the scheduler allocated the claim (None: not allocated yet)."""
    status = bed.get("resourceclaim", "-n", namespace, claim).get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return str(results[0]["device"]) if results else None


def kill_between_gi_and_ci(bed: Bed[KubeletNodeDaemon], namespace: str, name: str, prof: str,
                           killed: list[int]) -> tuple[int, int]:
    """A claim ``name`` for a ``prof`` instance of node-0's on-demand GPU and its pod;
    tessera-node killed while its ``nvidia-smi mig -cgi <prof>:<start> -C`` has made the GPU
    instance and not yet its compute instance (the simulator's compute-instance call made
    to take 30 s): the daemon and that nvidia-smi SIGKILLed, as a killed container's
    processes all are (the nvidia-smi's pid goes into ``killed`` first). (start, GPU
    instance ID) of the instance left without its compute instance."""
    daemon = bed.daemons[NODE]
    out = node_fault(daemon, CREATE_CI, 1, 30_000_000)
    assert out.returncode == 0, out.stderr
    bed.apply(namespace, profile_claim(name, prof))
    bed.apply(namespace, claim_pod(name, claim=name, command="cuda-info; sleep 3600"))
    device = wait_until("the claim allocated", lambda: allocated_device(bed, namespace, name),
                        60)
    start = int(device.split("-mig")[1].split("-")[0])
    assert device == f"gpu0-mig{start}-{prof.replace('.', '')}", device
    gi = wait_until("the GPU instance made at the allocated placement", lambda: next(
        (g for p, s, g in gpu_instances(daemon) if (p, s) == (prof, start)), None), 60)
    assert daemon.proc is not None
    tessera_node = daemon.proc.pid
    (pid,) = wait_until("the daemon's nvidia-smi inside the compute instance", lambda:
                        child_processes(tessera_node, "nvidia-smi"), 10)
    killed.append(pid)
    assert "-cgi" in Path(f"/proc/{pid}/cmdline").read_text(), pid
    # the daemon's container killed: the daemon first (nothing of it reacts), then its
    # nvidia-smi (which holds the GPU's host lock: the restarted daemon would wait for it)
    os.kill(tessera_node, signal.SIGKILL)
    daemon.proc.wait(10)
    os.kill(pid, signal.SIGKILL)
    wait_until("nvidia-smi killed", lambda: gone(pid), 10)
    assert gi not in compute_instances(daemon)
    return start, gi


def recover_from_kill(daemon: KubeletNodeDaemon, killed: list[int]) -> None:
    """After :func:`kill_between_gi_and_ci`, however the test ended: NVML healthy again, no
    nvidia-smi of the killed daemon left, the daemon running (killed, and the test failed
    before starting it again)."""
    node_fault(daemon, CREATE_CI, 0)
    for pid in killed:
        if not gone(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if daemon.proc is not None and daemon.proc.poll() is not None:
        daemon.restart()


def test_a_daemon_killed_between_the_gpu_and_the_compute_instance_converges_on_restart(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """node-0's H100 on demand, a claim for a 3g.40gb and its pod. tessera-node is killed
    while its ``nvidia-smi mig -cgi 3g.40gb:<start> -C`` has made the GPU instance and not
    yet its compute instance (the simulator's compute-instance call made slow): the daemon
    and that nvidia-smi are SIGKILLed, as a killed container's processes all are, leaving a
    GPU instance without a compute instance and no record of it in the daemon's checkpoint.
    Started again, the daemon completes that very instance when the kubelet asks to prepare
    the claim again: the pod runs on it, the GPU has exactly that one instance at the
    allocated placement with its compute instance (none made twice, none left over), and
    the partition's status names the claim; released, the instance is destroyed.
    Afterwards the GPU goes back to MIG disabled (for the tests after)."""
    from tessera.mig.catalog import profile as mig_profile

    ns, daemon = node_namespace, bed.daemons[NODE]
    name, prof = "crash", "3g.40gb"
    killed: list[int] = []  # the daemon's nvidia-smi, once found
    try:
        put_on_demand(bed)
        assert gpu_instances(daemon) == []
        start, gi = kill_between_gi_and_ci(bed, ns, name, prof, killed)
        # what the restarted daemon faces: the GPU instance, no compute instance in it
        assert gpu_instances(daemon) == [(prof, start, gi)]
        assert gi not in compute_instances(daemon)
        assert bed.pod(ns, name)["status"]["phase"] == "Pending"
        out = node_fault(daemon, CREATE_CI, 0)  # NVML healthy again
        assert out.returncode == 0, out.stderr

        restarted = time.monotonic()
        daemon.restart()
        ready_s = time.monotonic() - restarted
        # the kubelet asks to prepare again on its own schedule: within seconds, unless its
        # retry lands in the second it re-registers the restarted plugin ("not registered"),
        # after which it waits for its next resync of the pod (measured: 76 s)
        bed.wait_phase(ns, name, {"Running"}, 180)
        converged_s = time.monotonic() - restarted
        # that very instance, completed: one GPU instance, its compute instance, no other
        assert gpu_instances(daemon) == [(prof, start, gi)]
        assert compute_instances(daemon) == [gi]
        assert seen_memory_mib(bed, ns, name) == mig_profile("H100-80GB", prof).memory_mib
        wait_until("the report naming the claim", lambda: instance_claims(bed) == {
            (prof, start): f"{ns}/{name}"}, 30)
        print(f"[figures] daemon killed between -cgi and -cci: daemon ready {ready_s:.1f}s after "
              f"its restart, the pod running {converged_s:.1f}s after it, on GPU instance "
              f"{gi} at slot {start} completed")

        out = bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
        assert out.returncode == 0, out.stderr
        out = bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--wait=true")
        assert out.returncode == 0, out.stderr
        wait_until("the instance destroyed", lambda: gpu_instances(daemon) == [], 60)
    finally:
        recover_from_kill(daemon, killed)
        bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
        bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--ignore-not-found")
        put_whole(bed)


def test_an_instance_whose_claim_went_while_the_daemon_was_down_is_destroyed_once_idle(
        bed: Bed[KubeletNodeDaemon], node_namespace: str) -> None:
    """node-0's H100 on demand, a neighbour claim's 1g.10gb running. tessera-node is killed
    while it makes a 3g.40gb for a second claim (between its GPU instance and its compute
    instance, as above), and the pod and that claim are deleted while it is down: the
    restarted daemon has no record of the instance (its unprepare finds nothing to undo) and
    no claim is allocated its placement. It is destroyed once it has been so for
    ``--on-demand-idle`` (30 s here), and the GPU offers that placement again; the
    neighbour's instance and container are untouched. Afterwards the GPU goes back to MIG
    disabled (for the tests after)."""
    ns, daemon = node_namespace, bed.daemons[NODE]
    name, prof = "orphan", "3g.40gb"
    killed: list[int] = []  # the daemon's nvidia-smi, once found
    try:
        put_on_demand(bed)
        bed.apply(ns, profile_claim("keep", "1g.10gb"))
        bed.apply(ns, claim_pod("keep", claim="keep", command="cuda-info; sleep 3600"))
        bed.wait_phase(ns, "keep", {"Running"}, 120)
        ((_, kept_start, kept_gi),) = gpu_instances(daemon)
        start, gi = kill_between_gi_and_ci(bed, ns, name, prof, killed)
        assert sorted(gpu_instances(daemon)) == sorted([("1g.10gb", kept_start, kept_gi),
                                                        (prof, start, gi)])
        assert gi not in compute_instances(daemon)
        # the workload goes while nothing on the node can answer for it
        bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        bed.kubectl("delete", "resourceclaim", "-n", ns, name, "--wait=false")
        out = node_fault(daemon, CREATE_CI, 0)
        assert out.returncode == 0, out.stderr

        daemon.restart()
        wait_until("the pod and its claim gone", lambda: bed.kubectl(
            "get", "pod,resourceclaim", "-n", ns, name, "--ignore-not-found",
            "-o", "name").stdout.strip() == "", 180)
        claim_gone = time.monotonic()
        wait_until("the instance no claim has destroyed",
                   lambda: [(p, s) for p, s, _ in gpu_instances(daemon)] == [
                       ("1g.10gb", kept_start)], 120)
        destroyed_s = time.monotonic() - claim_gone
        assert daemon.metric("tessera_node_mig_on_demand_total", action="destroy",
                             result="ok") == 1
        assert compute_instances(daemon) == [kept_gi]
        freed = f"gpu0-mig{start}-{prof.replace('.', '')}"
        wait_until(f"{freed} offered again", lambda: published(bed, freed), 60)
        bed.assert_untouched(ns, "keep")
        print(f"[figures] an instance whose claim went while the daemon was down: destroyed "
              f"{destroyed_s:.1f}s after the claim was gone (--on-demand-idle 30 s)")
    finally:
        recover_from_kill(daemon, killed)
        for pod in ("keep", name):
            bed.kubectl("delete", "pod", "-n", ns, pod, "--wait=true")
            bed.kubectl("delete", "resourceclaim", "-n", ns, pod, "--ignore-not-found")
        put_whole(bed)
