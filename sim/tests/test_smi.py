"""The fake nvidia-smi against the real tool's formats (docs/mig.md §6)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from tessera_sim import BUILD_DIR

from .conftest import Node

# Sample A and B of the reference (real A100-40GB output).
SAMPLE_A = [
    "|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |",
    "|                                                             1     0     0   |",
    "+-----------------------------------------------------------------------------+",
]
SAMPLE_B = [
    "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2",
    "GPU  0 Profile ID  9 Placements: {0,4}:4",
    "GPU  0 Profile ID  0 Placement : {0}:8",
]


def test_list_and_query(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    r = node.smi("-L")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert lines[1].startswith("GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    r = node.smi("--query-gpu=index,name,memory.total,memory.used,mig.mode.current", "--format=csv")
    assert r.stdout.splitlines() == [
        "index, name, memory.total [MiB], memory.used [MiB], mig.mode.current",
        "0, NVIDIA H100 80GB HBM3, 81559 MiB, 0 MiB, Disabled",
        "1, NVIDIA A100-SXM4-40GB, 40960 MiB, 0 MiB, Disabled",
    ]
    r = node.smi("-i", "1", "--query-gpu=memory.total,pci.bus_id", "--format=csv,noheader,nounits")
    assert r.stdout.splitlines() == ["40960, 00000000:27:00.0"]
    r = node.smi("--query-gpu=bogus", "--format=csv")
    assert r.returncode == 2 and 'Field "bogus" is not a valid field to query.' in r.stdout
    r = node.smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv")
    assert r.stdout.splitlines() == ["pid, used_gpu_memory [MiB]"]


def test_lgip_and_lgipp_match_real_samples(make_node: Callable[..., Node]) -> None:
    node = make_node("A100-40GB:mig")
    out = node.smi("mig", "-lgip").stdout.splitlines()
    i = out.index(SAMPLE_A[0])
    assert out[i : i + 3] == SAMPLE_A
    assert out[1] == "| GPU instance profiles:".ljust(78) + "|"
    assert all(len(line) == 79 for line in out)
    out = node.smi("mig", "-lgipp").stdout.splitlines()
    for line in SAMPLE_B:
        assert line in out
    assert "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1" in out


def test_mig_mode_messages(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    r = node.smi("-i", "0", "-mig", "1")
    assert r.stdout.splitlines() == ["Enabled MIG Mode for GPU 00000000:17:00.0", "All done."]
    r = node.smi("-i", "1", "-mig", "1")
    assert r.stdout.splitlines() == [
        "Warning: MIG mode is in pending enable state for GPU 00000000:27:00.0:Not Supported",
        "Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU "
        "00000000:27:00.0",
        "All done.",
    ]
    r = node.smi("--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader")
    assert r.stdout.splitlines() == ["Enabled, Enabled", "Disabled, Enabled"]
    r = node.smi("-r", "-i", "1")
    assert r.returncode == 0 and "was successfully reset." in r.stdout
    r = node.smi("-i", "1", "--query-gpu=mig.mode.current", "--format=csv,noheader")
    assert r.stdout.strip() == "Enabled"


def test_create_list_destroy(make_node: Callable[..., Node]) -> None:
    node = make_node("A100-40GB:mig")
    r = node.smi("mig", "-cgi", "19,19,14,9")
    assert r.returncode != 0
    assert r.stdout.splitlines()[-2:] == [
        "Unable to create a GPU instance on GPU  0 using profile 9: Insufficient Resources",
        "Failed to create GPU instances: Insufficient Resources",
    ]
    assert node.smi("mig", "-dgi").returncode == 0
    assert node.smi("mig", "-lgi").stdout.strip() == "No GPU instances found: Not Found"
    r = node.smi("mig", "-cgi", "9", "-C")
    assert r.returncode == 0
    assert r.stdout.splitlines() == [
        "Successfully created GPU instance ID  2 on GPU  0 using profile MIG 3g.20gb (ID  9)",
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  2 using profile "
        "MIG 3g.20gb (ID  2)",
    ]
    r = node.smi("mig", "-cgi", "3g.20gb:0")
    created = "Successfully created GPU instance ID  1 on GPU  0 using profile MIG 3g.20gb (ID  9)"
    assert created in r.stdout
    out = node.smi("mig", "-lgi").stdout.splitlines()
    assert "|   0  MIG 3g.20gb          9        1          0:4     |" in out
    assert "|   0  MIG 3g.20gb          9        2          4:4     |" in out
    r = node.smi("mig", "-dgi", "-gi", "2")
    assert r.returncode != 0
    assert r.stdout.splitlines() == [
        "Unable to destroy GPU instance ID  2 from GPU  0: In use by another client",
        "Failed to destroy GPU instances: In use by another client",
    ]
    r = node.smi("mig", "-cci", "1c.3g.20gb", "-gi", "1")
    assert r.stdout.strip() == (
        "Successfully created compute instance ID  0 on GPU  0 GPU instance ID  1 using profile "
        "MIG 1c.3g.20gb (ID  0)"
    )
    out = node.smi("mig", "-lci").stdout
    assert "MIG 1c.3g.20gb" in out and "MIG 3g.20gb" in out
    r = node.smi("mig", "-dci")
    destroyed = "Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID  1"
    assert destroyed in r.stdout
    assert node.smi("mig", "-dgi").returncode == 0
    lines = node.smi("-L").stdout.splitlines()
    assert len(lines) == 1


def test_a_copy_of_the_build_runs_anywhere_without_a_shell_or_environment(
        make_node: Callable[..., Node], tmp_path: Path) -> None:
    """What the node daemon's container does: a copy of bin/nvidia-smi and lib/ mounted
    elsewhere, run with nothing but TESSERA_SIM_NODE (no PATH or LD_LIBRARY_PATH): the C tool
    finds libnvidia-ml.so.1 through its RUNPATH, $ORIGIN/../lib."""
    node = make_node("A100-40GB")
    root = tmp_path / "driver-root"
    shutil.copytree(BUILD_DIR / "lib", root / "lib", symlinks=True)
    (root / "bin").mkdir()
    shutil.copy2(BUILD_DIR / "bin" / "nvidia-smi", root / "bin" / "nvidia-smi")
    run = subprocess.run([str(root / "bin" / "nvidia-smi"), "-L"], capture_output=True,
                         text=True, timeout=60, env={"TESSERA_SIM_NODE": str(node.path)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == node.smi("-L").stdout
    assert run.stdout.startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    # it loads the copy's library, not the checkout's: a broken copy fails
    (root / "lib" / "libnvidia-ml.so.1").write_bytes(b"not a library")
    run = subprocess.run([str(root / "bin" / "nvidia-smi"), "-L"], capture_output=True,
                         text=True, timeout=60, env={"TESSERA_SIM_NODE": str(node.path)})
    assert run.returncode == 127 and "libnvidia-ml.so.1" in run.stderr, run.stderr


def test_a_second_media_extension_instance_is_refused(make_node: Callable[..., Node]) -> None:
    """Each +me instance takes the GPU's one OFA engine: on an A30 a 2g.12gb+me beside a
    1g.6gb+me is refused, as the driver refuses it, though each profile's own maximum count
    (1) allows it; -lgip shows none left of either."""
    node = make_node("A30-24GB:mig")
    assert node.smi("mig", "-cgi", "1g.6gb+me").returncode == 0
    r = node.smi("mig", "-cgi", "2g.12gb+me")
    assert r.returncode != 0 and "Insufficient Resources" in r.stdout, r.stdout
    assert node.smi("mig", "-cgi", "2g.12gb").returncode == 0  # no media engines: fine
    free = [line for line in node.smi("mig", "-lgip").stdout.splitlines() if "+me" in line]
    assert free and all(" 0/1 " in line for line in free), free
