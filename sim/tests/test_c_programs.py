"""The C tests of the driver API and NVML, against the plain and the ASan/UBSan builds."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tessera_sim import BUILD_DIR

from .conftest import Node

NODES = {"test_cuda": ("H100-80GB", "A100-40GB"), "test_nvml": ("A100-40GB:mig", "H100-80GB"),
         "test_runtime_driver": ("H100-80GB",),
         "test_devices": ("H100-80GB", "H100-80GB", "A100-40GB:mig")}


@pytest.mark.parametrize("variant", ["tests", "san/tests"])
@pytest.mark.parametrize("program", sorted(NODES))
def test_c_program(make_node: Callable[..., Node], program: str, variant: str,
                   tmp_path: Path) -> None:
    node = make_node(*NODES[program])
    (tmp_path / "container-dev").mkdir()
    env = dict(node.env, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1",
               TEST_DEV_DIR=str(tmp_path / "container-dev"))
    r = subprocess.run(
        [str(BUILD_DIR / variant / program)], env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"
