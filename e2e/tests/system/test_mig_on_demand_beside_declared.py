"""A declared and an on-demand GPU on one node, on a real kubelet (the device-plugin path):
node-0 has two H100s, GPU 1 in a GPUPartition declaring two ``3g.40gb``, GPU 0 in one with
``migMode: OnDemand``. Pods asking ``3g.40gb`` take the declared instances first; the one
they cannot hold gets an instance made on GPU 0; when the pods are gone, the instance made
on demand is destroyed and the declared ones stay exactly as they were.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import API_VERSION, SCHEDULER_NAME
from tessera.api.resources import mig_resource_name
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.operator.scheduler import TesseraScheduler

pytestmark = [pytest.mark.integration]

NODE = "node-0"
IDLE_S = 2
GI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+\d+\s+(\d+)\s+(\d+):\d+\s+\|$")
MIG_3G = mig_resource_name("3g.40gb")


def partition(name: str, index: int, layout: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}},
                     "gpus": {"indices": [index]}, "layout": layout,
                     "deletionPolicy": "Reset"}}


@pytest.fixture(scope="module")
def bed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Bed[Any]]:
    cluster = LocalCluster(bin_dir, default_layout(), nodes=1,
                           gpu_models=(("H100-80GB", "H100-80GB"),),
                           report=lambda line: print(f"[cluster] {line}"))
    try:
        cluster.start()
    except ControlPlaneError as error:
        pytest.fail(f"local cluster: {error}", pytrace=False)
    logdir = tmp_path_factory.mktemp("tessera-on-demand-beside")
    try:
        with gpu_bed(cluster, logdir, operator_args=("--scheduler-name", SCHEDULER_NAME),
                     daemon_args=("--on-demand-idle", str(IDLE_S))) as b:
            assert b.operators is not None
            sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, b.operators,
                                     logdir).start()
            try:
                b.apply("default", partition("declared", 1, {"profiles": [
                    {"name": "3g.40gb", "count": 2}]}))
                b.apply("default", partition("on-demand", 0, {"migMode": "OnDemand"}))
                wait_until("node-0 advertising the two declared 3g.40gb", lambda: b.allocatable(
                    NODE).get(MIG_3G) == "2", 120, 1)
                yield b
            finally:
                sched.stop()
    finally:
        cluster.stop(keep_logs=request.session.testsfailed > 0)


def instances(bed: Bed[Any]) -> list[tuple[int, str, int, int]]:
    """(GPU, profile, GPU instance ID, start) of node-0's instances (``-lgi``)."""
    out = bed.daemons[NODE].smi("mig", "-lgi").stdout
    return sorted((int(m[1]), m[2], int(m[3]), int(m[4])) for line in out.splitlines()
                  if (m := GI_ROW.match(line.strip())))


def asked_events(bed: Bed[Any], ns: str, name: str) -> list[str]:
    out = bed.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                      f"involvedObject.name={name},reason=MIGInstanceRequested")
    return [e["message"] for e in json.loads(out.stdout)["items"]]


def test_declared_instances_are_used_first_and_never_destroyed_beside_on_demand_ones(
        bed: Bed[Any]) -> None:
    ns = "beside"
    bed.kubectl("create", "namespace", ns)
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns)
    declared = instances(bed)
    assert [(g, p) for g, p, _, _ in declared] == [(1, "3g.40gb"), (1, "3g.40gb")], declared
    names = ("a", "b", "c")
    try:
        for name in names:
            bed.apply(ns, gpu_pod(name, "cuda-info; sleep 3600", {MIG_3G: "1"}, node=None))
        for name in names:
            bed.wait_phase(ns, name, {"Running"}, 120)
        asked = {n: asked_events(bed, ns, n) for n in names}
        made_for = [n for n, msgs in asked.items() if msgs]
        assert len(made_for) == 1, asked  # two took the declared instances
        assert "GPU 0" in asked[made_for[0]][0], asked
        now = instances(bed)
        assert [i for i in now if i[0] == 1] == declared  # untouched: same IDs and slots
        assert [(g, p) for g, p, _, _ in now if g == 0] == [(0, "3g.40gb")], now
        print(f"[figures] beside declared: pod {made_for[0]} got a 3g.40gb made on GPU 0, "
              "the others the declared ones on GPU 1")
    finally:
        for name in names:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        for name in names:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
    # gone: the on-demand instance destroyed after the grace, the declared ones kept
    wait_until("GPU 0's instance destroyed", lambda: [
        i for i in instances(bed) if i[0] == 0] == [], 60, 0.5)
    time.sleep(IDLE_S + 1)  # past the grace: the declared ones, idle too, stay
    assert instances(bed) == declared
