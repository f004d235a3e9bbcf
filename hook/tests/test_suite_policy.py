"""The suite cannot vanish: a test that cannot run because root, unshare(1), a Go toolchain,
valgrind or clang is missing fails and says what is missing. Only the real-GPU tier skips
(no /dev/nvidiactl), and says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tessera_hook_harness import ROOT

GPU_TIER = ROOT / "hook" / "tests" / "test_hook_gpu.py"
# Spelled in pieces so that this file does not match itself.
SKIPS = re.compile(r"pytest\.(skip\(|importor" r"skip\()|mark\.skip(if)?\b")


def test_no_test_skips_outside_the_gpu_tier() -> None:
    offenders = []
    for d in ("operator", "node-daemon", "sim", "hook", "e2e", "bench"):
        for path in sorted((ROOT / d).rglob("*.py")):
            if path == GPU_TIER or ".venv" in path.parts or "build" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if SKIPS.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "tests must fail, not skip, when they cannot run:\n" + "\n".join(
        offenders
    )


def test_hook_suite_fails_without_root() -> None:
    """The most safety-critical suite, run as an unprivileged user (a user namespace that
    maps us to nobody): it must fail, naming what it needs, instead of skipping green."""
    assert os.geteuid() == 0, "this test needs root (it drops to nobody in a user namespace)"
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT / 'e2e'}:{ROOT / 'sim'}"
    r = subprocess.run(
        [
            "unshare", "--user", "--map-user=65534", "--map-group=65534",
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
            str(ROOT / "hook" / "tests" / "test_hook.py") + "::test_memory_views",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "skipped" not in out.lower(), out
    assert "needs root" in out, out
