"""The DRA plugin as the daemon runs it (``--dra true``): libtessera installed, both sockets
served, a claim read with the daemon's API client on its event loop while the kubelet's call
waits in a gRPC thread; an API server that says the claim is gone, or cannot answer, fails
the claim with that reason; an on-demand instance no prepared claim holds is kept only while
a claim is allocated it (or the claims cannot be listed)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_dra_claims import G0, G1, M10, claim, gpus, result

from tessera.api.names import DRA_DRIVER
from tessera.kube.client import ApiError
from tessera_node.cli import build_parser, options
from tessera_node.device.state import MigInstanceState
from tessera_node.dra.proto import dra_v1_pb2
from tessera_node.dra.proto import dra_v1_pb2_grpc as dra_grpc
from tessera_node.dra.service import DraPlugin
from tessera_node.layout.on_demand import MadeInstance

REPO = Path(__file__).resolve().parents[3]
LIBTESSERA = REPO / "hook" / "build" / "libtessera.so"
U1 = "0f8fad5b-d9cb-469f-a165-70867728950e"
CLAIMS = "/apis/resource.k8s.io/v1/resourceclaims"


class FakeKube:
    """Answers GETs of ResourceClaims and LISTs of GPUQuotas from a dict (an ApiError where a
    test put one)."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}

    async def get(self, url: str) -> Any:
        found = self.objects.get(url)
        if found is None:
            raise ApiError(404, '{"message": "not found"}', f"GET {url}")
        if isinstance(found, ApiError):
            raise found
        await asyncio.sleep(0)
        return found

    async def list(self, url: str) -> Any:
        return await self.get(url)


def test_the_daemon_serves_claims_read_on_its_event_loop() -> None:
    assert LIBTESSERA.is_file(), "libtessera not built (make hook)"
    root = Path(tempfile.mkdtemp(prefix="dras-", dir="/tmp"))
    try:
        opts = options(build_parser().parse_args([
            "run", "--node-name", "node-a", "--state-dir", str(root / "state"),
            "--libtessera", str(LIBTESSERA), "--device-visibility", "volume-mounts",
            "--dra", "true", "--device-plugin", "false", "--kubelet-root", str(root / "kubelet"),
            "--cdi-dir", str(root / "cdi")]))
        assert opts.dra and opts.cdi_dir == str(root / "cdi")
        kube = FakeKube()
        url = "/apis/resource.k8s.io/v1/namespaces/team/resourceclaims/"
        obj = claim(result("gpu0", consumed={"memory": "1Gi", "cores": "10"}))
        obj["metadata"] = {"namespace": "team", "name": "ok", "uid": U1}
        kube.objects[url + "ok"] = obj
        kube.objects[url + "down"] = ApiError(503, "unavailable", f"GET {url}down")
        kube.objects["/apis/tessera.dev/v1alpha1/namespaces/team/gpuquotas"] = {"items": [
            {"metadata": {"name": "team"}, "spec": {"weight": 3, "lending": False}}]}
        plugin = DraPlugin(kube, opts, gpus, lambda: ())  # type: ignore[arg-type]
        assert plugin.not_ready() == ["DRA plugin: not started yet"]
        with pytest.raises(OSError, match="not read its prepared claims yet"):
            plugin.holders()  # the MIG enactor then counts every unit as held

        async def scenario() -> dict[str, Any]:
            task = asyncio.create_task(plugin.run())
            sock = root / "kubelet" / "plugins" / DRA_DRIVER / "dra.sock"
            while plugin.server is None or not sock.exists():
                await asyncio.sleep(0.05)
            assert plugin.not_ready() == ["DRA plugin: not registered with the kubelet yet"]
            stub = dra_grpc.DRAPluginStub(grpc.insecure_channel(f"unix://{sock}"))
            req = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
                dra_v1_pb2.Claim(namespace="team", name=n, uid=u) for n, u in (
                    ("ok", U1), ("gone", "11111111-0000-4000-8000-000000000000"),
                    ("down", "22222222-0000-4000-8000-000000000000"))])
            resp = await asyncio.to_thread(stub.NodePrepareResources, req, timeout=10)
            # what keeps an on-demand instance no prepared claim holds, asked from a worker
            # thread as the runner asks it: a claim allocated its placement, or its MIG
            # device; nothing else; the claims not listed: it stays (fail closed)
            plugin.on_demand = lambda: {1: (G1, "H100-80GB")}
            allocated = claim(result("gpu1-mig4-3g40gb"))
            allocated["metadata"]["name"] = "big"
            by_device = claim(result("gpu1-mig0-1g10gb"))
            by_device["metadata"]["name"] = "small"
            kube.objects[CLAIMS] = {"items": [allocated, by_device]}
            keeps = {}
            for key, inst, have in (
                    ("placement", MadeInstance(1, G1, "3g.40gb", 4),
                     MigInstanceState(9, "3g.40gb", 4, 4, 2)),
                    ("device", MadeInstance(1, G1, "1g.10gb", 0),
                     MigInstanceState(19, "1g.10gb", 0, 1, 3, uuid=M10)),
                    ("nothing", MadeInstance(1, G1, "1g.10gb", 6),
                     MigInstanceState(19, "1g.10gb", 6, 1, 5, uuid="MIG-x"))):
                keeps[key] = await asyncio.to_thread(plugin.keeps_instance, inst, have)
            kube.objects[CLAIMS] = ApiError(503, "unavailable", f"GET {CLAIMS}")
            keeps["unlisted"] = await asyncio.to_thread(
                plugin.keeps_instance, MadeInstance(1, G1, "1g.10gb", 6),
                MigInstanceState(19, "1g.10gb", 6, 1, 5, uuid="MIG-x"))
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return {"claims": dict(resp.claims), "keeps": keeps}

        answered = asyncio.run(scenario())
        assert answered["keeps"] == {
            "placement": "allocated to team/big (ResourceClaim)",
            "device": "allocated to team/small (ResourceClaim)",
            "nothing": None,
            "unlisted": answered["keeps"]["unlisted"]}
        assert answered["keeps"]["unlisted"].startswith(
            "the claims allocated here cannot be read (listing ResourceClaims"), answered
        got = answered["claims"]
        assert got[U1].error == "" and [d.cdi_device_ids for d in got[U1].devices] == [
            [f"{DRA_DRIVER}/claim={U1}"]]
        assert "ResourceClaim team/gone does not exist" in got[
            "11111111-0000-4000-8000-000000000000"].error
        assert "reading ResourceClaim team/down" in got[
            "22222222-0000-4000-8000-000000000000"].error
        installed = list((root / "state" / "lib").iterdir())
        assert len(installed) == 1 and (installed[0] / "libtessera.so").is_file()
        assert G0 in (root / "cdi" / f"{DRA_DRIVER}-claim-{U1}.json").read_text()
        assert plugin.server is None  # stopped with the task
        # the prepared claim holds its unit against a MIG change; the refused ones hold none
        assert plugin.holders() == {G0: ["team/ok (ResourceClaim)"]}
        # and is a container to the core controllers and the audit, with its quota's policy
        (c,) = plugin.containers()
        assert (c.key, c.claim, c.units, c.quota, c.weight, c.lending) == (
            U1, "team/ok", (G0,), "team/team", 3, False)
        assert c.budget_file == str(root / "state" / "claims" / U1 / "budget")
    finally:
        shutil.rmtree(root)
