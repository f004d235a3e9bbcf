"""tessera's DRA devices against a real API server: a node's ResourceSlices (H100s shared
and NVLinked, whole and shared MIG instances) are accepted as written, read back without
loss where consumable capacity is on (1.36 and later) and with exactly the gated fields lost
where it is off (1.34, alpha), and republishing what was read back writes nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import DRA_DRIVER, MIG_PREFIX, VGPU
from tessera.dra.devices import node_devices
from tessera.dra.slices import as_kept, dropped, plan
from tessera.mig.catalog import profile
from tessera_e2e.chart import helm
from tessera_e2e.controlplane.build import ensure_helm
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.cluster import server_minor as cluster_server_minor
from tessera_e2e.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

NODE = "dra-node-a"
H100 = "H100-80GB"


def gpu(index: int, units: list[AdvertisedUnit], peers: tuple[str, ...] = ()) -> GPUInventory:
    return GPUInventory(index=index, uuid=uuid(index), model=H100, memoryMiB=81559,
                        numaNode=index // 2, pciBusId=f"00000000:{index + 16:02X}:00.0",
                        nvlinkPeers=peers, units=tuple(units),
                        migMode="enabled" if units and units[0].profile else "disabled")


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-1111-2222-3333-444444444444"


def instance(index: int, name: str, start: int, whole: bool) -> AdvertisedUnit:
    return AdvertisedUnit(uuid=f"MIG-{index:04d}{start:04d}-1111-2222-3333-444444444444",
                          resource=MIG_PREFIX + name if whole else VGPU,
                          memoryMiB=profile(H100, name).memory_mib, shares=0 if whole else 10,
                          profile=name, start=start)


def node() -> list[GPUInventory]:
    whole = [AdvertisedUnit(uuid=uuid(i), resource=VGPU, memoryMiB=81559, shares=10)
             for i in range(2)]
    return [gpu(0, [whole[0]], (uuid(1),)), gpu(1, [whole[1]], (uuid(0),)),
            gpu(2, [instance(2, "1g.10gb", s, True) for s in range(7)]),
            gpu(3, [instance(3, "3g.40gb", s, False) for s in (0, 4)])]


def server_minor(cluster: LocalCluster) -> int:
    return cluster_server_minor(cluster.kubectl)


def published(cluster: LocalCluster) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "resourceslices", "-o", "json",
                          "--field-selector", f"spec.nodeName={NODE}")
    assert out.returncode == 0, out.stderr
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def test_the_api_server_keeps_the_devices_and_republishing_writes_nothing(
        cluster: LocalCluster) -> None:
    devices = node_devices(node())
    assert len(devices) == 11
    first = plan(NODE, devices, [])
    try:
        for obj in first.create:
            out = cluster.kubectl("create", "-f", "-", input=json.dumps(obj))
            assert out.returncode == 0, out.stderr
        held = published(cluster)
        assert [s["spec"]["driver"] for s in held] == [DRA_DRIVER]
        lost = dropped(devices, [d for s in held for d in s["spec"]["devices"]])
        if server_minor(cluster) >= 36:
            assert lost == [], lost
        else:  # 1.34: DRAConsumableCapacity is alpha, off: the API server drops it silently
            assert lost == ["allowMultipleAllocations", "capacity cores requestPolicy",
                            "capacity memory requestPolicy"], lost
        again = plan(NODE, as_kept(devices, lost), held)
        assert again.writes == 0, again
    finally:
        cluster.kubectl("delete", "resourceslices", "--field-selector",
                        f"spec.nodeName={NODE}")


EXAMPLES = REPO / "examples" / "dra"


def test_the_device_classes_and_the_example_claims_are_accepted(
        cluster: LocalCluster, namespace: str) -> None:
    """The chart's DeviceClasses (CEL compiled by the API server) and examples/dra's
    ResourceClaimTemplates: accepted as written; their capacity requests kept where
    consumable capacity is on (1.36 and later), dropped where it is off (1.34)."""
    try:
        binary = ensure_helm()
    except Exception as exc:  # no helm: fail, never skip
        pytest.fail(f"helm unavailable: {exc}")
    docs = helm.template(binary, "ts", {"nodeDaemon": {"dra": {"nodeLabels": {"p": "dra"}}}})
    classes = [d for d in docs if d["kind"] == "DeviceClass"]
    assert sorted(c["metadata"]["name"] for c in classes) == [DRA_DRIVER, f"mig.{DRA_DRIVER}"]
    try:
        for c in classes:
            out = cluster.kubectl("create", "-f", "-", input=json.dumps(c))
            assert out.returncode == 0, out.stderr
        files = sorted(EXAMPLES.glob("*.yaml"))
        assert [f.name for f in files] == ["h100-4gi-30pct.yaml",
                                           "two-gpus-one-nvlink-clique.yaml",
                                           "whole-3g40gb.yaml"]
        for f in files:
            out = cluster.kubectl("create", "-n", namespace, "-f", str(f))
            assert out.returncode == 0, (f.name, out.stderr)
        out = cluster.kubectl("get", "resourceclaimtemplates", "-n", namespace, "-o", "json")
        assert out.returncode == 0, out.stderr
        held = {t["metadata"]["name"]: t["spec"]["spec"]["devices"]
                for t in json.loads(out.stdout)["items"]}
        clique = held["two-gpus-one-nvlink-clique"]
        assert clique["constraints"] == [{"requests": ["gpus"],
                                          "matchAttribute": f"{DRA_DRIVER}/nvlinkClique"}]
        assert clique["requests"][0]["exactly"]["count"] == 2
        assert held["whole-3g40gb"]["requests"][0]["exactly"]["deviceClassName"] == (
            f"mig.{DRA_DRIVER}")
        share = held["h100-4gi-30pct"]["requests"][0]["exactly"]
        if server_minor(cluster) >= 36:
            assert share["capacity"]["requests"] == {"memory": "4Gi", "cores": "30"}
        else:  # DRAConsumableCapacity off: dropped without an error (a whole shared GPU)
            assert "capacity" not in share, share
    finally:
        for c in classes:
            cluster.kubectl("delete", "deviceclass", c["metadata"]["name"],
                            "--ignore-not-found")
