"""Fixtures for the simulated GPU node's tests: build once, then a fresh node per test."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera_sim import BIN_DIR, LIB_DIR, SIM_DIR
from tessera_sim.node import GPUSpec, write_node


@pytest.fixture(scope="session", autouse=True)
def built() -> None:
    """Build sim/ (a no-op when the top-level `make sim` already did)."""
    subprocess.run(
        ["make", "-s", "-C", str(SIM_DIR), f"PYTHON={sys.executable}"],
        check=True, stdout=subprocess.DEVNULL,
    )


class Node:
    """A simulated node: its description file and the environment that points at it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = dict(os.environ)
        self.env["TESSERA_SIM_NODE"] = str(path)
        self.env["LD_LIBRARY_PATH"] = f"{LIB_DIR}:{self.env.get('LD_LIBRARY_PATH', '')}"
        self.env["PATH"] = f"{BIN_DIR}:{self.env['PATH']}"
        self.env["PYTHONPATH"] = f"{SIM_DIR}:{self.env.get('PYTHONPATH', '')}"
        self.env.pop("CUDA_VISIBLE_DEVICES", None)

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN_DIR / "nvidia-smi"), *args], env=self.env, capture_output=True, text=True,
            timeout=60,
        )

    def python(self, code: str, **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", code], env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,  # type: ignore[call-overload]
        )


@pytest.fixture
def make_node(tmp_path: Path) -> Callable[..., Node]:
    counter = iter(range(1000))

    def make(*gpus: str, **kwargs: Any) -> Node:
        path = tmp_path / f"node{next(counter)}.conf"
        write_node(path, [GPUSpec.parse(g) for g in gpus], **kwargs)
        return Node(path)

    return make


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Node], object]]:
    """pynvml, loaded against the simulator's libnvidia-ml, initialised on a node."""
    import pynvml

    monkeypatch.setattr(pynvml, "nvmlLib", ctypes.CDLL(str(LIB_DIR / "libnvidia-ml.so.1")))
    # pynvml caches resolved functions; keep ours out of other tests' pynvml.
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    started: list[bool] = []

    def start(node: Node) -> object:
        monkeypatch.setenv("TESSERA_SIM_NODE", str(node.path))
        pynvml.nvmlInit()
        started.append(True)
        return pynvml

    yield start
    for _ in started:
        pynvml.nvmlShutdown()
