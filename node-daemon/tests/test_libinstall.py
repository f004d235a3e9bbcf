"""libtessera's install into a versioned host directory (the DaemonSet's init container)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_node.deviceplugin.response import LIB_NAME, PRELOAD_NAME, preload_line
from tessera_node.libinstall import install, main


def test_installs_once_and_never_rewrites_a_version(tmp_path: Path) -> None:
    src = tmp_path / "libtessera.so"
    src.write_bytes(b"\x7fELF v1")
    target = tmp_path / "host" / "0.1.0"
    assert install(src, target) == [target / LIB_NAME, target / PRELOAD_NAME]
    assert (target / LIB_NAME).read_bytes() == b"\x7fELF v1"
    assert (target / LIB_NAME).stat().st_mode & 0o777 == 0o755
    assert (target / PRELOAD_NAME).read_text() == preload_line()
    inode = (target / LIB_NAME).stat().st_ino
    assert install(src, target) == []  # a restart of the same version: nothing written
    assert (target / LIB_NAME).stat().st_ino == inode
    assert not [p for p in target.iterdir() if p.name.startswith(".")]  # no temp files left


def test_another_build_under_the_same_version_is_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    src = tmp_path / "libtessera.so"
    src.write_bytes(b"one")
    target = tmp_path / "0.1.0"
    assert main([str(src), str(target)]) == 0
    src.write_bytes(b"two")
    assert main([str(src), str(target)]) == 1
    assert "exists with other content" in capsys.readouterr().err
    assert (target / LIB_NAME).read_bytes() == b"one"  # a running container's library stays


def test_a_missing_source_is_a_clear_error(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.so"), str(tmp_path / "v")]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main([]) == 2
