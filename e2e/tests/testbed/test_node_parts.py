"""The nodes' parts that need no running node: images, addresses, configuration files."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import tarfile
import tomllib
from dataclasses import replace
from pathlib import Path

import yaml

from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.cluster import SERVICE_CIDR, SIM_BUILD
from tessera_e2e.nodes.config import (
    NodeSettings,
    cni_conflist,
    containerd_toml,
    kube_proxy_config,
    kubelet_config,
)
from tessera_e2e.nodes.images import (
    PAUSE,
    WORKLOAD,
    ImageFile,
    ensure_images,
    layer_tar,
    oci_archive,
)
from tessera_e2e.nodes.network import SLOTS, Plan

FILES = {"bin/hello": ImageFile(b"#!/bin/sh\necho hello\n", 0o755),
         "bin/sh": ImageFile(link="busybox")}


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()  # type: ignore[union-attr]
                if m.isfile()}


def test_same_files_give_the_same_digest_and_any_change_another() -> None:
    first = oci_archive("tessera.local/x:1", FILES, {"Cmd": ["/bin/hello"]})
    assert oci_archive("tessera.local/x:1", dict(reversed(FILES.items())),
                       {"Cmd": ["/bin/hello"]}) == first
    changed = dict(FILES, **{"bin/hello": ImageFile(b"#!/bin/sh\necho bye\n", 0o755)})
    assert oci_archive("tessera.local/x:1", changed, {"Cmd": ["/bin/hello"]})[0] != first[0]
    mode = dict(FILES, **{"bin/hello": ImageFile(FILES["bin/hello"].data, 0o700)})
    assert oci_archive("tessera.local/x:1", mode, {"Cmd": ["/bin/hello"]})[0] != first[0]


def test_layers_carry_no_time_owner_or_order_of_the_build_machine() -> None:
    with tarfile.open(fileobj=io.BytesIO(layer_tar(FILES))) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["bin", "bin/hello", "bin/sh"]  # parents added, sorted
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    assert members[2].issym() and members[2].linkname == "busybox"


def test_the_archive_is_an_oci_layout_whose_digests_check_out() -> None:
    digest, archive = oci_archive("tessera.local/x:1", FILES, {"Cmd": ["/bin/hello"]})
    members = _members(archive)
    for name, blob in members.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    entry = json.loads(members["index.json"])["manifests"][0]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "tessera.local/x:1"
    manifest = json.loads(members[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(members[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    layer = manifest["layers"][0]["digest"]
    assert config["rootfs"]["diff_ids"] == [layer]  # uncompressed: diff ID = layer digest
    assert (config["os"], config["architecture"]) == ("linux", "amd64")


def test_the_project_images_are_reproducible_and_cached(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    first = ensure_images(layout, SIM_BUILD / "lib")
    archives = {ref: image.archive.stat().st_mtime_ns for ref, image in first.items()}
    again = ensure_images(layout, SIM_BUILD / "lib")
    assert {ref: image.digest for ref, image in again.items()} == \
        {ref: image.digest for ref, image in first.items()}
    assert {ref: image.archive.stat().st_mtime_ns for ref, image in again.items()} == archives
    workload = _members(first[WORKLOAD].archive.read_bytes())
    manifest = json.loads(workload[f"blobs/sha256/{first[WORKLOAD].digest[7:]}"])
    files = _members(workload[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"])
    assert {"bin/busybox", "usr/local/bin/cuda-info", "usr/local/bin/cuda-alloc",
            "usr/local/bin/nvml-info", "lib64/ld-linux-x86-64.so.2"} <= set(files)
    assert not any("libcuda" in name for name in files)  # the node provides it
    assert b"libcuda.so.1" in files["usr/local/bin/cuda-info"]  # ... and the program needs it
    assert b"libnvidia-ml.so.1" in files["usr/local/bin/nvml-info"]
    assert PAUSE in first


def test_addresses_of_every_slot_are_distinct_and_fit() -> None:
    service = ipaddress.ip_network(SERVICE_CIDR)
    seen: set[str] = set()
    for slot in range(SLOTS):
        plan = Plan(slot)
        assert len(plan.bridge) <= 15 and len(plan.veth(9)) <= 15  # Linux interface names
        cluster = ipaddress.ip_network(plan.cluster_cidr)
        node_net = ipaddress.ip_network(f"{plan.host_ip}/{plan.prefix_length}", strict=False)
        for index in range(10):
            subnet = ipaddress.ip_network(plan.pod_subnet(index))
            assert subnet.subnet_of(cluster)  # type: ignore[arg-type]
            assert ipaddress.ip_address(plan.node_ip(index)) in node_net
            assert plan.pod_gateway(index) == str(subnet[1])
        assert not cluster.overlaps(node_net) and not cluster.overlaps(service)
        assert plan.cluster_cidr not in seen and str(node_net) not in seen
        seen |= {plan.cluster_cidr, str(node_net)}
    # the machine's own resolver (10.255.255.53 here) stays outside every test bed
    assert not any(ipaddress.ip_address("10.255.255.53") in ipaddress.ip_network(n)
                   for n in seen)


SETTINGS = NodeSettings(
    name="node-0", node_ip="172.20.0.10", pod_subnet="10.100.0.0/24",
    cluster_cidr="10.100.0.0/16", cgroup_root="/tessera-run-node-0",
    sandbox_image=PAUSE, ca_cert="/pki/ca.crt", serving_cert="/n/kubelet.crt",
    serving_key="/n/kubelet.key", kubelet_kubeconfig="/n/kubelet.kubeconfig",
    proxy_kubeconfig="/n/kube-proxy.kubeconfig", resolv_conf="/n/resolv.conf",
)


def test_containerd_is_told_what_this_machine_needs() -> None:
    config = tomllib.loads(containerd_toml(SETTINGS))
    assert config["version"] == 3  # containerd 2's format: the CRI plugin split in two
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert runtime["restrict_oom_score_adj"] is True  # the VM refuses to lower oom_score_adj
    assert images["pinned_images"]["sandbox"] == PAUSE  # ours, never pulled
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}
    # CDI for DRA drivers, from the node's own /run: never a directory every node shares
    assert runtime["enable_cdi"] is True and runtime["cdi_spec_dirs"] == ["/var/run/cdi"]
    assert "io.containerd.internal.v1.opt" in config["disabled_plugins"]  # no /opt/containerd


def test_containerd_1_7_of_the_oldest_release_gets_its_own_format() -> None:
    config = tomllib.loads(containerd_toml(replace(SETTINGS, containerd_major=1)))
    assert config["version"] == 2
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True and cri["sandbox_image"] == PAUSE
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/var/run/cdi"]
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "SystemdCgroup": False}


def test_kubelet_never_collects_images_and_states_cgroup_v1() -> None:
    config = kubelet_config(SETTINGS)
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/tessera-run-node-0"
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["seccompDefault"] is True  # a hardened node: RuntimeDefault unless stated
    assert yaml.safe_load(yaml.safe_dump(config)) == config


def test_pods_get_the_nodes_subnet_and_kube_proxy_the_clusters() -> None:
    bridge = json.loads(cni_conflist(SETTINGS))["plugins"][0]
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.100.0.0/24"}]]
    assert bridge["ipMasq"] is False and bridge["hairpinMode"] is True
    proxy = kube_proxy_config(SETTINGS)
    assert (proxy["mode"], proxy["clusterCIDR"]) == ("iptables", "10.100.0.0/16")
