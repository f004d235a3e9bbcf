"""tessera-node ``--dra`` against the real API server: a node daemon on a simulated GPU node
publishes its node's ResourceSlices, writes nothing over resyncs at idle, writes them again
when they are deleted, withdraws MIG instances from them before it destroys them, and
reports a server that drops the consumable-capacity fields (the oldest release, 1.34).
The chart's policy keeps a daemon to its own node's slices."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import ANNOTATION_NODE_FINDINGS, DRA_DRIVER
from tessera.dra.partitions import placement_device_name
from tessera.mig.catalog import profiles
from tessera_e2e.controlplane.cluster import server_minor as cluster_server_minor
from tessera_e2e.gpubed.daemons import DAEMON_SA, NodeDaemonProcess, bound_token, create_node
from tessera_e2e.operator.replicas import OPERATOR_NS, render_chart, token_kubeconfig, wait_until
from tessera_sim.node import NvLink, Topology

from .conftest import StartDaemon
from .test_mig_enactment import FAST, apply_partition, cleanup, entry, pool_name
from .test_node_daemon import annotations, events
from .test_node_restriction import as_token

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

LIBTESSERA = Path(__file__).resolve().parents[3] / "hook" / "build" / "libtessera.so"


def dra() -> list[str]:
    """A DRA node's flags: no device plugin (no kubelet: FAST's nodes); the DRA kubelet
    plugin serves in a kubelet root of its own (no kubelet registers it here; a short path:
    unix socket paths are)."""
    assert LIBTESSERA.is_file(), "libtessera not built (make hook)"
    tmp = Path(tempfile.mkdtemp(prefix="kr", dir="/tmp"))
    return ["--dra", "true", "--libtessera", str(LIBTESSERA),
            "--kubelet-root", str(tmp / "kubelet"), "--cdi-dir", str(tmp / "cdi")]


IDLE_RESYNCS = 5
GATED = ["allowMultipleAllocations", "capacity cores requestPolicy",
         "capacity memory requestPolicy"]


@pytest.fixture(scope="module")
def dra_chart(chart: Any) -> Any:
    """The chart's permissions with a DRA pool: the daemon's resourceslices rights and the
    policy that narrows them (applied over the session's chart)."""
    text = render_chart(values={"nodeDaemon": {"dra": {"nodeLabels": {"pool": "dra"}}}})
    out = chart.kubectl("apply", "-f", "-", input=text)
    assert out.returncode == 0, out.stderr
    return chart


@pytest.fixture
def pool() -> Iterator[str]:
    yield pool_name("dra")


def slices(cluster: Any, node: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "resourceslices", "-o", "json", "--field-selector",
                          f"spec.nodeName={node}")
    assert out.returncode == 0, out.stderr
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def devices(cluster: Any, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(cluster, node) for d in s["spec"].get("devices") or []}


def published(cluster: Any, d: NodeDaemonProcess, names: set[str], timeout: float = 40
              ) -> dict[str, dict[str, Any]]:
    try:
        out: dict[str, dict[str, Any]] = wait_until(
            f"{d.node} publishing {sorted(names)}",
            lambda: (got if set(got := devices(cluster, d.node)) == names else None), timeout,
            0.2)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; published now: {sorted(devices(cluster, d.node))}; log: "
                           f"{d.log.read_text()[-2500:]}") from None
    return out


def writes(d: NodeDaemonProcess) -> float:
    return sum(d.metric("tessera_node_dra_slice_writes_total", op=op, result=r) or 0
               for op in ("create", "update", "delete") for r in ("ok", "error"))


def server_minor(cluster: Any) -> int:
    return cluster_server_minor(cluster.kubectl)


def smi_uuids(d: NodeDaemonProcess) -> set[str]:
    """GPU and MIG device UUIDs as nvidia-smi -L lists them (NVML's view)."""
    out = d.sim.smi("-L")
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"UUID: ((?:GPU|MIG)-[^)\s]+)", out.stdout))


def test_the_node_publishes_its_gpus_writes_nothing_at_idle_and_republishes(
        dra_chart: Any, start_daemon: StartDaemon) -> None:
    topo = Topology(nvlink=(NvLink(0, 1),))
    d = start_daemon(["H100-80GB"] * 2, extra=[*FAST, *dra()], topology=topo)
    t0 = time.monotonic()
    got = published(dra_chart, d, {"gpu0", "gpu1"})
    appeared_s = time.monotonic() - t0
    (s,) = slices(dra_chart, d.node)
    assert (s["spec"]["driver"], s["spec"]["pool"]["name"]) == (DRA_DRIVER, d.node)
    uuids = smi_uuids(d)
    attrs = {n: dev["attributes"] for n, dev in got.items()}
    assert {a["uuid"]["string"] for a in attrs.values()} == uuids
    assert all(a["model"]["string"] == "H100-80GB" for a in attrs.values())
    assert [attrs[n]["nvlinkClique"]["int"] for n in ("gpu0", "gpu1")] == [0, 0]
    # idle: resync after resync plans again and writes nothing
    wait_until("the first pass counted", lambda: writes(d) > 0, 10)
    before, rv = writes(d), s["metadata"]["resourceVersion"]
    passes = d.metric("tessera_node_dra_publish_passes_total", outcome="unchanged") or 0
    wait_until(f"{IDLE_RESYNCS} resyncs", lambda: (d.metric(
        "tessera_node_dra_publish_passes_total", outcome="unchanged") or 0) >= passes
        + IDLE_RESYNCS, 2 * IDLE_RESYNCS * 2 + 10, 0.5)
    assert writes(d) == before
    assert slices(dra_chart, d.node)[0]["metadata"]["resourceVersion"] == rv
    print(f"\n[figures] dra: slice published {appeared_s:.1f}s after start; "
          f"{IDLE_RESYNCS} idle resyncs: {writes(d) - before:.0f} writes")
    # deleted by hand (as the kubelet does at its start): written again
    out = dra_chart.kubectl("delete", "resourceslices", "--field-selector",
                            f"spec.nodeName={d.node}")
    assert out.returncode == 0, out.stderr
    t1 = time.monotonic()
    published(dra_chart, d, {"gpu0", "gpu1"}, 20)
    print(f"[figures] dra: slices deleted by hand back after {time.monotonic() - t1:.1f}s")
    # the consumable-capacity fields: kept from 1.36 on; on 1.34 (gate off) dropped, reported
    stored = devices(dra_chart, d.node)["gpu0"]
    findings = json.loads(annotations(dra_chart, d.node).get(ANNOTATION_NODE_FINDINGS, "[]"))
    loss = [f for f in findings if f["kind"] == "DRAFieldsDropped"]
    if server_minor(dra_chart) >= 36:
        assert stored.get("allowMultipleAllocations") is True
        assert "requestPolicy" in stored["capacity"]["memory"]
        assert loss == []
        assert d.metric("tessera_node_dra_fields_dropped", field=GATED[0]) is None
    else:
        assert "allowMultipleAllocations" not in stored
        wait_until("the loss on the Node", lambda: any(
            f["kind"] == "DRAFieldsDropped" for f in json.loads(annotations(
                dra_chart, d.node).get(ANNOTATION_NODE_FINDINGS, "[]"))), 20)
        assert [d.metric("tessera_node_dra_fields_dropped", field=f) for f in GATED] == [
            1, 1, 1]
        # the Event follows the Node's patch
        evs = wait_until("the DRAFieldsDropped Event", lambda: [
            e for e in events(dra_chart, d.node) if e["reason"] == "DRAFieldsDropped"], 20)
        assert len(evs) == 1 and "allowMultipleAllocations" in evs[0]["message"], evs
        # reported, not rewritten at every resync
        before = writes(d)
        time.sleep(3 * 2)
        assert writes(d) == before
    failed = [r for r in d.log_records() if r.get("msg") == "task failed; restarting"]
    assert failed == [], failed[:1]


def last_write_before(d: NodeDaemonProcess, ts: float) -> set[str]:
    """The devices of the daemon's last ResourceSlice write logged before ``ts``."""
    done = [r for r in d.log_records() if r.get("msg") == "ResourceSlices written"
            and r["ts"] <= ts]
    assert done, "no ResourceSlice write before"
    return set(done[-1]["devices"])


def smi_starts(d: NodeDaemonProcess, since: float, flag: str) -> list[dict[str, Any]]:
    return [r for r in d.log_records(since) if r.get("msg") == "nvidia-smi start"
            and flag in r.get("argv", [])]


def test_mig_instances_are_withdrawn_from_the_slices_before_they_are_destroyed(
        dra_chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["H100-80GB"], {"pool": pool}, [*FAST, *dra()])
    part = f"{pool}-p"
    published(dra_chart, d, {"gpu0"})
    try:
        wait_until("the first pass counted", lambda: writes(d) > 0, 10)
        w0 = writes(d)
        t_seven = time.time()
        apply_partition(dra_chart, part, pool, {"1g.10gb": 7})
        entry(dra_chart, d, part, "Ready")
        seven = {f"gpu0-mig{s}-1g10gb" for s in range(7)}
        got = published(dra_chart, d, seven)
        w_seven = writes(d) - w0
        assert {dev["attributes"]["uuid"]["string"] for dev in got.values()} == {
            u for u in smi_uuids(d) if u.startswith("MIG-")}
        # the whole GPU left the slice before MIG mode was switched on
        (mode,) = smi_starts(d, t_seven, "-mig")
        assert "gpu0" not in last_write_before(d, mode["ts"])
        t_change = time.time()
        apply_partition(dra_chart, part, pool, {"3g.40gb": 1, "1g.10gb": 3})
        entry(dra_chart, d, part, "Ready", generation=2)
        after = set(wait_until("the new layout published", lambda: (
            got if len(got := devices(dra_chart, d.node)) == 4
            and any(n.endswith("3g40gb") for n in got) else None), 40, 0.2))
        destroyed = seven - after
        assert len(destroyed) == 4 and "gpu0-mig0-3g40gb" in after
        w_change = writes(d) - w0 - w_seven
        print(f"\n[figures] dra: ResourceSlice writes per MIG change: whole GPU -> 7x 1g.10gb "
              f"{w_seven:.0f}; 7x 1g.10gb -> 3g.40gb + 3x 1g.10gb {w_change:.0f} "
              f"(4 instances destroyed, 1 made)")
        # one write to withdraw what a command destroys (at most one per instance), one to
        # publish what NVML shows after: never a write per resync or per command
        assert 1 <= w_seven <= 2 and 1 <= w_change <= len(destroyed) + 1, (w_seven, w_change)
        for flag in ("-dci", "-dgi"):
            cmds = smi_starts(d, t_change, flag)
            assert cmds, f"no {flag}"
            for c in cmds:
                assert destroyed.isdisjoint(last_write_before(d, c["ts"])), (flag, c)
        withdrawn = [r for r in d.log_records(t_change)
                     if r.get("msg") == "devices withdrawn from the ResourceSlices"]
        assert withdrawn and withdrawn[0]["ts"] <= smi_starts(d, t_change, "-dci")[0]["ts"]
        # the slice the API server holds: the new instances, each with its NVML UUID
        mig = {u for u in smi_uuids(d) if u.startswith("MIG-")}
        assert {dev["attributes"]["uuid"]["string"]
                for dev in devices(dra_chart, d.node).values()} == mig
        failed = [r for r in d.log_records() if r.get("msg") == "task failed; restarting"]
        assert failed == [], failed[:1]
    finally:
        cleanup(dra_chart, part)


def slice_body(node: str, driver: str = DRA_DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}-{uuid.uuid4().hex[:4]}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": []}}


def test_a_daemon_writes_its_own_nodes_slices_only(dra_chart: Any, tmp_path: Path) -> None:
    a, b = (f"dr-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for n in (a, b):
        create_node(dra_chart.kubectl, n)
    try:
        on_a, on_b = bound_token(dra_chart.kubectl, a), bound_token(dra_chart.kubectl, b)
        mine = slice_body(a)

        def create(token: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
            kc = token_kubeconfig(dra_chart.kubeconfig, tmp_path, token,
                                  f"t-{uuid.uuid4().hex[:6]}")
            return subprocess.run([str(dra_chart.kubectl_path), "--kubeconfig", str(kc),
                                   "create", "-f", "-"], input=json.dumps(body),
                                  capture_output=True, text=True, timeout=60)
        ok = wait_until("the policy in force", lambda: (
            r if (r := create(on_a, mine)).returncode == 0 else None), 20, 1)
        assert ok.returncode == 0
        name = mine["metadata"]["name"]
        out = create(on_b, slice_body(a))
        assert "tessera-node-resourceslices" in out.stderr and (
            f"tessera-node on node {b} may write the ResourceSlices of its own node only"
            in out.stderr), out.stderr
        out = as_token(dra_chart, tmp_path, on_b, "delete", "resourceslice", name)
        assert "may write the ResourceSlices of its own node only" in out.stderr, out.stderr
        out = create(on_a, slice_body(a, "gpu.nvidia.com"))
        assert "of the driver gpu.tessera.dev only" in out.stderr, out.stderr
        unbound = dra_chart.kubectl("create", "token", DAEMON_SA, "-n", OPERATOR_NS)
        out = create(unbound.stdout.strip(), slice_body(a))
        assert "token bound to its pod" in out.stderr, out.stderr
        out = as_token(dra_chart, tmp_path, on_a, "delete", "resourceslice", name)
        assert out.returncode == 0, out.stderr
    finally:
        dra_chart.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={a}")
        for n in (a, b):
            dra_chart.kubectl("delete", "node", n, "--wait=false")


def test_an_on_demand_gpu_publishes_its_placements_and_their_counters(
        dra_chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    """A GPUPartition with migMode OnDemand on GPU 1 (at most 3 instances) beside one that
    declares two 3g.40gb on GPU 0: MIG is enabled on both, nothing created on GPU 1; from
    1.36 the node publishes GPU 0's two instances and every placement of an empty H100 on
    GPU 1 with its counter set in a slice of its own; on 1.34 (no partitionable devices)
    GPU 0's instances only, and the node says why."""
    d = start_daemon(["H100-80GB"] * 2, {"pool": pool}, [*FAST, *dra()])
    part, declared = f"{pool}-od", f"{pool}-decl"
    published(dra_chart, d, {"gpu0", "gpu1"})
    selector = {"matchLabels": {"pool": pool}}
    bodies = [{"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
               "metadata": {"name": part},
               "spec": {"nodeSelector": selector, "gpus": {"indices": [1]},
                        "layout": {"migMode": "OnDemand", "onDemand": {"maxInstances": 3}}}},
              {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
               "metadata": {"name": declared},
               "spec": {"nodeSelector": selector, "gpus": {"indices": [0]},
                        "layout": {"profiles": [{"name": "3g.40gb", "count": 2}]}}}]
    try:
        for body in bodies:
            out = dra_chart.kubectl("apply", "-f", "-", input=json.dumps(body))
            assert out.returncode == 0, out.stderr
        entry(dra_chart, d, part, "Ready")
        entry(dra_chart, d, declared, "Ready")
        halves = {"gpu0-mig0-3g40gb", "gpu0-mig4-3g40gb"}
        smi = d.sim.smi("-i", "1", "--query-gpu=mig.mode.current", "--format=csv,noheader")
        assert smi.stdout.strip() == "Enabled", smi.stdout + smi.stderr
        listed = d.sim.smi("-L").stdout
        assert listed.count("MIG 3g.40gb") == 2 and listed.count("MIG-") == 2, listed
        if server_minor(dra_chart) < 36:
            got = published(dra_chart, d, halves)
            wait_until("the finding on the Node", lambda: any(
                f["kind"] == "DRAOnDemandUnavailable" for f in json.loads(annotations(
                    dra_chart, d.node).get(ANNOTATION_NODE_FINDINGS, "[]"))), 20)
            evs = wait_until("the DRAOnDemandUnavailable Event", lambda: [
                e for e in events(dra_chart, d.node)
                if e["reason"] == "DRAOnDemandUnavailable"], 20)
            assert len(evs) == 1 and evs[0]["message"].startswith(
                "GPU 1 in migMode OnDemand publish no devices"), evs
            return
        names = {placement_device_name(1, p.name, s) for p in profiles("H100-80GB")
                 for s in p.starts}
        got = published(dra_chart, d, {*halves, *names})
        assert all(dev["consumesCounters"][0]["counterSet"] == "gpu1-slices"
                   for n, dev in got.items() if n not in halves)
        assert all("consumesCounters" not in got[n] for n in halves)
        sets = [c for s in slices(dra_chart, d.node) for c in s["spec"].get("sharedCounters")
                or []]
        assert [c["name"] for c in sets] == ["gpu1-slices"]
        assert sets[0]["counters"]["instances"] == {"value": "3"}
        assert sets[0]["counters"]["compute-slices"] == {"value": "7"}
        findings = json.loads(annotations(dra_chart, d.node).get(ANNOTATION_NODE_FINDINGS,
                                                                 "[]"))
        assert findings == [], findings
        failed = [r for r in d.log_records() if r.get("msg") == "task failed; restarting"]
        assert failed == [], failed[:1]
    finally:
        cleanup(dra_chart, part, declared)
