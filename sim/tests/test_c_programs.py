"""The C driver-API tests, against the plain and the ASan/UBSan builds of libcuda."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tessera_sim import BUILD_DIR

from .conftest import Node


@pytest.mark.parametrize("variant", ["tests", "san/tests"])
def test_cuda_driver_api(make_node: Callable[..., Node], variant: str) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    env = dict(node.env, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="halt_on_error=1")
    r = subprocess.run(
        [str(BUILD_DIR / variant / "test_cuda")], env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"
