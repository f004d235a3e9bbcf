"""A node with a topology of its own: tessera-node over four simulated H100s, NVLink pairs 0-1
and 2-3 on NUMA nodes 0 and 1, publishes each GPU's NUMA node, PCI bus ID, NVLink peers and
the units its device plugin advertises on the Node (``tessera.dev/gpus``).

The test runs a one-node cluster of its own (``LocalCluster(gpu_models=[NodeGPUs(...)])``,
e2e/README.md "Real nodes"): the session clusters' nodes have the test bed's fixed GPUs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.inventory import AdvertisedUnit, GPUInventory, from_node
from tessera.api.names import ANNOTATION_PLACEMENT, SCHEDULER_NAME, VGPU
from tessera.models import get_model
from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import SHARES, Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.nodes.node import NodeGPUs
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.operator.scheduler import TesseraScheduler

pytestmark = pytest.mark.integration

PAIRS = NodeGPUs(("H100-80GB",) * 4, nvlink="0-1,2-3", numa="0,0,1,1")


@pytest.fixture(scope="module")
def topo(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[LocalCluster, Bed[Any], Path]]:
    tmp = tmp_path_factory.mktemp("topology")
    with LocalCluster(bin_dir, Layout(tmp / "run"), nodes=1, gpu_models=[PAIRS],
                      report=lambda line: None) as cluster:
        logs = tmp / "logs"
        logs.mkdir()
        with gpu_bed(cluster, logs) as bed:
            yield cluster, bed, logs


def inventory(cluster: LocalCluster) -> tuple[GPUInventory, ...]:
    out = cluster.kubectl("get", "node", "node-0", "-o", "json")
    assert out.returncode == 0, out.stderr
    return from_node(json.loads(out.stdout)).gpus


def test_daemon_publishes_topology_and_advertised_units(
        topo: tuple[LocalCluster, Bed[Any], Path]) -> None:
    cluster, bed, _ = topo
    wait_until("node-0's units published",
               lambda: len(g := inventory(cluster)) == 4 and all(x.units for x in g), 60)
    gpus = inventory(cluster)
    uuid = [g.uuid for g in gpus]
    assert [g.numa_node for g in gpus] == [0, 0, 1, 1]
    assert [g.pci_bus_id for g in gpus] == [
        "00000000:17:00.0", "00000000:27:00.0", "00000000:37:00.0", "00000000:47:00.0"]
    assert [g.nvlink_peers for g in gpus] == [
        (uuid[1],), (uuid[0],), (uuid[3],), (uuid[2],)]
    memory = get_model("H100-80GB").memory_mib
    assert [g.units for g in gpus] == [
        (AdvertisedUnit(uuid=u, resource=VGPU, memory_mib=memory, shares=SHARES),)
        for u in uuid]
    # and the kubelet was told the same: every unit's shares
    wait_until("node-0 allocatable", lambda: bed.allocatable("node-0").get(VGPU)
               == str(4 * SHARES), 30)


def test_a_two_gpu_pod_gets_an_nvlink_pair_through_tessera_scheduler(
        topo: tuple[LocalCluster, Bed[Any], Path]) -> None:
    """One GPU holds a large pod, so its NVLink pair cannot take a container of two 20,000
    MiB shares; its peer and a GPU of the other pair could (both empty) but are not joined:
    tessera-scheduler places it on the other pair, and the container sees exactly those two
    GPUs."""
    cluster, bed, logs = topo
    assert bed.operators is not None
    wait_until("node-0's units published",
               lambda: len(g := inventory(cluster)) == 4 and all(x.units for x in g), 60)
    uuid = [g.uuid for g in inventory(cluster)]
    sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, bed.operators, logs).start()
    try:
        ns = "topology"
        cluster.kubectl("create", "namespace", ns)
        cluster.wait_for_service_account(ns)
        bed.quota(ns)
        for name, command, limits in (
                ("big", "cuda-info && sleep 600", vgpu(70000, cores=20)),
                ("pair", "cuda-info", vgpu(40000, cores=40, shares=2))):
            pod = gpu_pod(name, command, limits)
            pod["spec"]["schedulerName"] = SCHEDULER_NAME
            bed.apply(ns, pod)
            bed.wait_phase(ns, name, {"Running", "Succeeded"}, 120)
        placed = {n: json.loads(bed.pod(ns, n)["metadata"]["annotations"][ANNOTATION_PLACEMENT])
                  for n in ("big", "pair")}
        big = uuid.index(placed["big"]["containers"]["main"][VGPU][0])
        other_pair = sorted(uuid[i] for i in range(4) if i // 2 != big // 2)
        assert sorted(placed["pair"]["containers"]["main"][VGPU]) == other_pair, placed
        bed.wait_phase(ns, "pair", {"Succeeded"}, 60)
        seen = [line.split() for line in bed.logs(ns, "pair").splitlines()
                if line[:1].isdigit() and "GPU-" in line]
        assert sorted(w for ws in seen for w in ws if w.startswith("GPU-")) == other_pair, \
            bed.logs(ns, "pair")
    finally:
        sched.stop()
