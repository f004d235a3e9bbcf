"""A claim's CDI spec: tessera's device, named by the claim's UID, carrying what the device
plugin's Allocate gives a container (libtessera, budget, ledger, marker) and the visibility of
exactly the claim's units, for each visibility mode."""

from __future__ import annotations

import pytest

from tessera_node.container.response import (
    CONTAINER_LIB_DIR,
    CONTAINER_RUN,
    SIM_DEV_DIR,
    TOOLKIT_DEVICE_LIST_DIR,
    HostPaths,
    SimPaths,
    Visibility,
    container_response,
)
from tessera_node.dra import cdi

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
G0 = "GPU-00000000-1111-2222-3333-444444444444"
M1 = "MIG-00010000-1111-2222-3333-444444444444"
PATHS = HostPaths("/s/lib/abc", "/s/claims/u/budget", "/s/claims/u/run/ledger",
                  "/s/claims/managed")
SIM = SimPaths.of("/g/lib", "/g/node.conf")
COMMON = {
    f"{CONTAINER_LIB_DIR}/libtessera.so": ("/s/lib/abc/libtessera.so", "ro"),
    "/etc/ld.so.preload": ("/s/lib/abc/ld.so.preload", "ro"),
    f"{CONTAINER_RUN}/ledger": ("/s/claims/u/run/ledger", "rw"),
    f"{CONTAINER_RUN}/budget": ("/s/claims/u/budget", "ro"),
    f"{CONTAINER_RUN}/managed": ("/s/claims/managed", "ro"),
}
CASES: list[tuple[Visibility, tuple[str, ...], dict[str, tuple[str, str]], list[str],
                  list[str]]] = [
    ("volume-mounts", (), {f"{TOOLKIT_DEVICE_LIST_DIR}/{G0}": ("/dev/null", "ro"),
                           f"{TOOLKIT_DEVICE_LIST_DIR}/{M1}": ("/dev/null", "ro")},
     [f"NVIDIA_VISIBLE_DEVICES={TOOLKIT_DEVICE_LIST_DIR}"],
     [f"gpu.tessera.dev/claim={UID}"]),
    ("cdi", (), {}, [],
     [f"gpu.tessera.dev/claim={UID}", f"nvidia.com/gpu={G0}", f"nvidia.com/gpu={M1}"]),
    ("sim", ("nvidia0", "nvidia1", "nvidia-caps/nvidia-cap12"), {
        "/usr/local/tessera-sim/lib": ("/g/lib", "ro"),
        "/usr/local/tessera-sim/node.ini": ("/g/node.conf", "ro"),
        "/usr/local/tessera-sim/node.state": ("/g/node.conf.state", "rw"),
        f"{SIM_DEV_DIR}/nvidia0": ("/g/dev/nvidia0", "ro"),
        f"{SIM_DEV_DIR}/nvidia1": ("/g/dev/nvidia1", "ro"),
        f"{SIM_DEV_DIR}/nvidia-caps/nvidia-cap12": ("/g/dev/nvidia-caps/nvidia-cap12", "ro")},
     ["LD_LIBRARY_PATH=/usr/local/tessera-sim/lib",
      "TESSERA_SIM_DEV=/usr/local/tessera-sim/dev",
      "TESSERA_SIM_NODE=/usr/local/tessera-sim/node.ini",
      "TESSERA_SIM_STATE=/usr/local/tessera-sim/node.state"],
     [f"gpu.tessera.dev/claim={UID}"]),
]


@pytest.mark.parametrize(("visibility", "files", "mounts", "env", "ids"), CASES,
                         ids=[c[0] for c in CASES])
def test_the_spec_gives_the_claims_container_its_budget_and_only_its_units(
        visibility: Visibility, files: tuple[str, ...], mounts: dict[str, tuple[str, str]],
        env: list[str], ids: list[str]) -> None:
    resp = container_response(PATHS, [G0, M1], visibility, SIM, files)
    spec = cdi.spec(UID, resp)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "gpu.tessera.dev/claim")
    (device,) = spec["devices"]
    assert device["name"] == UID
    edits = device["containerEdits"]
    got = {m["containerPath"]: (m["hostPath"], m["options"][0]) for m in edits["mounts"]}
    assert got == COMMON | mounts
    assert all(m["type"] == "bind" and "rbind" in m["options"] for m in edits["mounts"])
    assert edits.get("env", []) == env
    assert cdi.device_ids(UID, resp) == ids


def test_every_claim_has_its_own_file_and_name() -> None:
    other = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    assert cdi.file_name(UID) != cdi.file_name(other)
    assert cdi.file_name(UID) == f"gpu.tessera.dev-claim-{UID}.json"
    assert cdi.device_id(UID) != cdi.device_id(other)
