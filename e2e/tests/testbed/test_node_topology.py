"""A node with a topology of its own: tessera-node over four simulated H100s, NVLink pairs 0-1
and 2-3 on NUMA nodes 0 and 1, publishes each GPU's NUMA node, PCI bus ID, NVLink peers and
the units its device plugin advertises on the Node (``tessera.dev/gpus``).

The test runs a one-node cluster of its own (``LocalCluster(gpu_models=[NodeGPUs(...)])``,
e2e/README.md "Real nodes"): the session clusters' nodes have the test bed's fixed GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.api.inventory import AdvertisedUnit, GPUInventory, from_node
from tessera.api.names import VGPU
from tessera.models import get_model
from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import SHARES, gpu_bed
from tessera_e2e.nodes.node import NodeGPUs
from tessera_e2e.operator.replicas import wait_until

pytestmark = pytest.mark.integration

PAIRS = NodeGPUs(("H100-80GB",) * 4, nvlink="0-1,2-3", numa="0,0,1,1")


def test_daemon_publishes_topology_and_advertised_units(bin_dir: Path, tmp_path: Path) -> None:
    with LocalCluster(bin_dir, Layout(tmp_path / "run"), nodes=1, gpu_models=[PAIRS],
                      report=lambda line: None) as cluster:
        logs = tmp_path / "logs"
        logs.mkdir()

        def inventory() -> tuple[GPUInventory, ...]:
            out = cluster.kubectl("get", "node", "node-0", "-o", "json")
            assert out.returncode == 0, out.stderr
            return from_node(json.loads(out.stdout)).gpus

        with gpu_bed(cluster, logs) as bed:
            wait_until("node-0's units published",
                       lambda: len(g := inventory()) == 4 and all(x.units for x in g), 60)
            gpus = inventory()
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
