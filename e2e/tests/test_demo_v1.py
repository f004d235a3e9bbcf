"""`python -m tessera_e2e demo --exit` does what it says, end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tessera_e2e.demo import REPO_ROOT

pytestmark = pytest.mark.integration


def test_demo_shows_the_resources_and_cleans_up() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "e2e"))
    result = subprocess.run(
        [sys.executable, "-m", "tessera_e2e", "demo", "--exit"],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Control plane ready in" in out
    assert "$ kubectl get tessera -A" in out
    assert "gpupartition.tessera.dev/" in out and "gpuquota.tessera.dev/" in out
    kubeconfig = re.search(r"export KUBECONFIG=(\S+)", out)
    assert kubeconfig is not None
    assert "Stopping the cluster now (--exit)." in out
    assert not Path(kubeconfig.group(1)).exists()  # it said it stops: nothing is left
