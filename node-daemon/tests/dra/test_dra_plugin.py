"""The DRA kubelet plugin driven over its sockets by a fake kubelet: registration, prepare
(budget file, ledger, marker, CDI spec, CDI IDs), a claim it cannot honour, prepare again
(same answer, what is missing written again), a daemon restart (answered from the
checkpoint), unprepare (exactly what prepare made, also after a crash, and for a claim it
never saw)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_dra_claims import G0, GIB, M10, NODE, claim, gpus, result

from tessera.api.names import DRA_DRIVER
from tessera_node.budget.formats import read_budget_file
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container.response import (
    CONTAINER_RUN,
    LIB_NAME,
    TOOLKIT_DEVICE_LIST_DIR,
    SimPaths,
)
from tessera_node.container.sim_files import SimDeviceFiles
from tessera_node.dra.checkpoint import Checkpoint
from tessera_node.dra.claims import ClaimError
from tessera_node.dra.prepare import ClaimPreparer, DraConfig, NodeView
from tessera_node.dra.proto import dra_v1_pb2, pluginregistration_pb2
from tessera_node.dra.proto import dra_v1_pb2_grpc as dra_grpc
from tessera_node.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from tessera_node.dra.server import DraServer

U1 = "0f8fad5b-d9cb-469f-a165-70867728950e"
U2 = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


class Node:
    """A node's state directory, kubelet root and CDI directory; the claims the API server
    holds; the plugin as the daemon runs it (``start`` again: a restarted daemon)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.cdi = root / "cdi"
        self.kubelet = root / "kubelet"
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.server: DraServer | None = None

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        found = self.claims.get((namespace, name))
        if found is None:
            raise ClaimError(f"ResourceClaim {namespace}/{name} does not exist")
        return found

    def start(self) -> DraServer:
        if self.server is not None:
            self.server.stop()
        lib = self.state / "lib" / "v1"
        config = DraConfig(node=NODE, lib_dir=str(lib), visibility="volume-mounts",
                           cdi_dir=str(self.cdi))
        preparer = ClaimPreparer(config, BudgetWriter(self.state / "claims", 1000),
                                 Checkpoint(self.state / "dra" / "checkpoint.json"),
                                 self.read_claim, NodeView(gpus))
        self.server = DraServer(preparer, self.kubelet)
        self.server.start()
        return self.server

    def dra(self) -> Any:
        assert self.server is not None
        return dra_grpc.DRAPluginStub(grpc.insecure_channel(f"unix://{self.server.endpoint}"))

    def prepare(self, *claims: tuple[str, str]) -> dict[str, Any]:
        req = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace="team", name=n, uid=u) for n, u in claims])
        return dict(self.dra().NodePrepareResources(req, timeout=10).claims)

    def unprepare(self, *uids: str) -> dict[str, str]:
        req = dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace="team", name="c", uid=u) for u in uids])
        return {u: r.error for u, r in self.dra().NodeUnprepareResources(req, timeout=10)
                .claims.items()}

    def spec(self, uid: str) -> Path:
        return self.cdi / f"{DRA_DRIVER}-claim-{uid}.json"


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))  # socket paths stay short
    n = Node(root)
    n.claims[("team", "shared")] = with_uid(claim(result(
        "gpu0", consumed={"memory": "4Gi", "cores": "30"}, share="s1")), "shared", U1)
    n.start()
    yield n
    if n.server is not None:
        n.server.stop()
    shutil.rmtree(root)


def with_uid(obj: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    obj["metadata"] = {"namespace": "team", "name": name, "uid": uid}
    return obj


def test_the_kubelet_learns_the_plugin_and_its_outcome_shows_in_readiness(node: Node) -> None:
    server = node.server
    assert server is not None
    assert server.registration == node.kubelet / "plugins_registry" / f"{DRA_DRIVER}-reg.sock"
    reg = reg_grpc.RegistrationStub(grpc.insecure_channel(f"unix://{server.registration}"))
    info = reg.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
    assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
        "DRAPlugin", DRA_DRIVER, str(node.kubelet / "plugins" / DRA_DRIVER / "dra.sock"),
        ["v1.DRAPlugin"])
    assert server.not_ready() == ["DRA plugin: not registered with the kubelet yet"]
    reg.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
        plugin_registered=False, error="none of services supported"), timeout=5)
    assert server.not_ready() == [
        "DRA plugin: the kubelet refused its registration: none of services supported"]
    reg.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
        plugin_registered=True), timeout=5)
    assert server.not_ready() == []
    server.registration.unlink()  # a wiped registry directory: served (and registered) again
    assert server.serve_again_if_gone() and server.registration.is_socket()
    assert server.not_ready() == ["DRA plugin: not registered with the kubelet yet"]


def test_prepare_writes_the_budget_and_the_cdi_spec_and_answers_the_cdi_id(node: Node) -> None:
    got = node.prepare(("shared", U1))[U1]
    assert got.error == ""
    (dev,) = got.devices
    assert (list(dev.request_names), dev.pool_name, dev.device_name, list(dev.cdi_device_ids),
            dev.share_id) == (["gpu"], NODE, "gpu0", [f"{DRA_DRIVER}/claim={U1}"], "s1")
    budget = read_budget_file(node.state / "claims" / U1 / "budget")
    assert budget.state == "ready"
    (entry,) = budget.entries
    assert (entry.uuid, entry.memory, entry.cores) == (G0, 4 * GIB, 30)
    ledger = node.state / "claims" / U1 / "run" / "ledger"
    assert ledger.is_file()
    spec = json.loads(node.spec(U1).read_text())
    assert spec["kind"] == f"{DRA_DRIVER}/claim" and spec["cdiVersion"] == "0.6.0"
    (device,) = spec["devices"]
    assert device["name"] == U1
    mounts = {m["containerPath"]: (m["hostPath"], m["options"][0])
              for m in device["containerEdits"]["mounts"]}
    assert mounts == {
        f"/usr/local/lib/tessera/{LIB_NAME}": (str(node.state / "lib/v1" / LIB_NAME), "ro"),
        "/etc/ld.so.preload": (str(node.state / "lib/v1/ld.so.preload"), "ro"),
        f"{CONTAINER_RUN}/ledger": (str(ledger), "rw"),
        f"{CONTAINER_RUN}/budget": (str(node.state / "claims" / U1 / "budget"), "ro"),
        f"{CONTAINER_RUN}/managed": (str(node.state / "claims" / "managed"), "ro"),
        f"{TOOLKIT_DEVICE_LIST_DIR}/{G0}": ("/dev/null", "ro"),  # only the allocated unit
    }
    assert device["containerEdits"]["env"] == [f"NVIDIA_VISIBLE_DEVICES={TOOLKIT_DEVICE_LIST_DIR}"]


def test_a_claim_it_cannot_honour_fails_alone_with_its_reason(node: Node) -> None:
    node.claims[("team", "elsewhere")] = with_uid(claim(result("gpu0", pool="node-b")),
                                                  "elsewhere", U2)
    got = node.prepare(("shared", U1), ("elsewhere", U2))
    assert got[U1].error == "" and len(got[U1].devices) == 1
    assert "allocated for another node" in got[U2].error and not got[U2].devices
    assert not node.spec(U2).exists() and not (node.state / "claims" / U2).exists()
    gone = node.prepare(("missing", "9b2e6c1c-0000-4000-8000-000000000000"))
    assert "does not exist" in gone["9b2e6c1c-0000-4000-8000-000000000000"].error


def test_prepare_again_answers_the_same_and_writes_what_is_missing(node: Node) -> None:
    first = node.prepare(("shared", U1))[U1]
    budget = node.state / "claims" / U1 / "budget"
    inode = budget.stat().st_ino
    node.spec(U1).unlink()  # /var/run/cdi after a reboot
    again = node.prepare(("shared", U1))[U1]
    assert again == first
    assert node.spec(U1).is_file()
    assert budget.stat().st_ino == inode  # a running container's budget file, kept
    assert node.reads == 1  # answered from what it prepared


def test_a_restarted_daemon_keeps_its_claims_and_unprepare_removes_them(node: Node) -> None:
    first = node.prepare(("shared", U1))[U1]
    node.claims.clear()  # the claim is gone from the API server; its pod still runs
    node.start()
    assert node.prepare(("shared", U1))[U1] == first
    assert node.unprepare(U1) == {U1: ""}
    assert not node.spec(U1).exists()
    assert not (node.state / "claims" / U1).exists()
    node.start()  # and it stays forgotten
    assert "does not exist" in node.prepare(("shared", U1))[U1].error


def test_unprepare_after_a_crash_before_the_checkpoint_and_of_unknown_claims(
        node: Node) -> None:
    node.prepare(("shared", U1))
    checkpoint = node.state / "dra" / "checkpoint.json"
    checkpoint.write_text(json.dumps({"version": 1, "claims": {}}))  # as if killed before it
    node.start()
    assert node.unprepare(U1, U2) == {U1: "", U2: ""}
    assert not node.spec(U1).exists()
    assert not (node.state / "claims" / U1).exists()
    assert sorted(p.name for p in node.cdi.iterdir()) == []


def test_a_whole_mig_instance_and_a_share_in_one_claim(node: Node) -> None:
    node.claims[("team", "two")] = with_uid(claim(
        result("gpu1-mig0-1g10gb", "whole"),
        result("gpu0", "share", consumed={"memory": "1Gi", "cores": "100"}, share="s9")),
        "two", U2)
    got = node.prepare(("two", U2))[U2]
    assert [(list(d.request_names), d.device_name, d.share_id) for d in got.devices] == [
        (["whole"], "gpu1-mig0-1g10gb", ""), (["share"], "gpu0", "s9")]
    budget = read_budget_file(node.state / "claims" / U2 / "budget")
    assert [(e.index, e.uuid, e.memory, e.cores) for e in budget.entries] == [
        (0, M10, None, None), (1, G0, GIB, None)]


def test_a_uid_that_is_not_one_names_no_file(node: Node) -> None:
    assert "is not a claim UID" in node.unprepare("../../etc")["../../etc"]


def test_a_claim_whose_files_cannot_be_written_leaves_nothing_behind(node: Node) -> None:
    server = node.server
    assert server is not None
    missing = SimPaths.of(str(node.root / "nolib"), str(node.root / "no-node.conf"))
    server.preparer.config = dataclasses.replace(  # the driver's capability table is gone
        server.preparer.config, visibility="sim", sim=missing)
    server.preparer.sim_files = SimDeviceFiles("sim", missing)
    got = node.prepare(("shared", U1))[U1]
    assert "device files" in got.error and not got.devices
    assert not (node.state / "claims" / U1).exists()
    assert not node.spec(U1).exists()
    assert json.loads((node.state / "dra" / "checkpoint.json").read_text())["claims"] == {}
