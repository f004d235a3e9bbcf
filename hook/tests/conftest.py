from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tessera_hook_harness import Container, build, missing_prerequisite, prepare_host_mountpoints


@pytest.fixture(scope="session")
def hook_built() -> None:
    why = missing_prerequisite()
    if why:
        pytest.fail(why)
    build()
    prepare_host_mountpoints()


@pytest.fixture
def container(hook_built: None, tmp_path: Path) -> Iterator[Container]:
    c = Container(tmp_path, "c1")
    c.set_simple()
    yield c
    c.budget.close()
