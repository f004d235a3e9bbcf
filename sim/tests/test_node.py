"""Node descriptions come from the one model table; bad descriptions give clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera.models import get_model
from tessera_sim import SIM_DIR
from tessera_sim.node import GPUSpec, node_description

from .conftest import Node


def test_description_from_model_table() -> None:
    text = node_description([GPUSpec("H200-141GB", mig=True)], seed="s")
    m = get_model("H200-141GB")
    assert f"name={m.nvml_name}" in text
    assert f"memory_mib={m.memory_mib}" in text
    assert f"sm_count={m.sm_count}" in text
    assert "mig_mode=1" in text and "mig_mode_change=immediate" in text
    assert "mig_mode_change=reset" in node_description([GPUSpec("A100-80GB")])
    with pytest.raises(KeyError):
        GPUSpec.parse("V100-16GB")


def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "n.conf"
    env = dict(os.environ, PYTHONPATH=f"{SIM_DIR}:{os.environ.get('PYTHONPATH', '')}")
    r = subprocess.run(
        [sys.executable, "-m", "tessera_sim", "node", "--gpu", "H100-80GB", "--gpu", "A30-24GB:mig",
         "--out", str(out)], capture_output=True, text=True, env=env,
    )
    assert r.returncode == 0, r.stderr
    assert out.read_text().count("[gpu]") == 2
    r = subprocess.run([sys.executable, "-m", "tessera_sim", "node", "--gpu", "X", "--out",
                        str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "unknown GPU model 'X'" in r.stderr


def test_bad_description_is_reported(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB")
    node.path.write_text("[gpu]\nmodel=H100-80GB\nmemory_mib=lots\n")
    r = node.smi("-L")
    assert r.returncode != 0
    assert "bad value 'lots' for 'memory_mib'" in r.stderr
    env = dict(node.env)
    env.pop("TESSERA_SIM_NODE")
    r = subprocess.run([str(Path(node.env["PATH"].split(":")[0]) / "nvidia-smi"), "-L"], env=env,
                       capture_output=True, text=True)
    assert "TESSERA_SIM_NODE is not set" in r.stderr
