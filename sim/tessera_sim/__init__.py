"""The simulated GPU node: node descriptions, the reference nvidia-smi, test helpers."""

from __future__ import annotations

from pathlib import Path

SIM_DIR = Path(__file__).resolve().parent.parent
BUILD_DIR = SIM_DIR / "build"
LIB_DIR = BUILD_DIR / "lib"
SAN_LIB_DIR = BUILD_DIR / "san" / "lib"
BIN_DIR = BUILD_DIR / "bin"
