"""Work-conserving fair share end to end on the simulator: three test containers with core
budgets 20/30/50 and equal weights saturating one simulated GPU (or one MIG instance) under
the standalone controller. Shares are measured from the controller's own NVML windows
(100 ms periods), so load on the machine stretches a run but does not change what is
asserted; latencies in wall-clock seconds are the benchmark's (bench/fairshare.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tessera_hook_harness import ROOT


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_fairshare",
                                                  ROOT / "bench" / "fairshare.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


BUDGETS = {"a": 20.0, "b": 30.0, "c": 50.0}
NAMES = list(BUDGETS)


def test_split_lend_and_reclaim(hook_built: None, tmp_path: Path, bench: ModuleType) -> None:
    warm, measure, idle, back = 3.0, 8.0, 3.0, 3.0
    marks: dict[str, float] = {}

    def script(run: object, rec: dict[str, object]) -> None:
        w = float(rec["t"])  # type: ignore[arg-type]
        if "idle" not in marks and w >= warm + measure:
            run.stop("a")  # type: ignore[attr-defined]
            marks["idle"] = float(rec["t"])  # type: ignore[arg-type]
        elif "back" not in marks and w >= warm + measure + idle:
            run.spin("a", back + 5)  # type: ignore[attr-defined]
            marks["back"] = float(rec["t"])  # type: ignore[arg-type]

    run = bench.scenario(tmp_path, BUDGETS, warm + measure + idle + back, script)
    steps = run.steps
    # all saturating: each within 2 points of its budget over the measured window
    got = bench.shares(steps, NAMES, warm, warm + measure)
    for n in NAMES:
        assert abs(got[n] - BUDGETS[n]) <= 2.0, got
    # a idle: b and c absorb its share (its last second idle, after lending began)
    t_idle = marks["idle"]
    late = [s for s in steps if t_idle + idle - 1.5 <= float(s["t"]) < t_idle + idle - 0.3]
    assert late
    b, c = (bench.busy_fraction(late, n) for n in ("b", "c"))
    assert bench.field_of(late[-1], "a", "lent") > 0.1, late[-1]
    grants = [(bench.field_of(s, "b", "borrowed"), bench.field_of(s, "c", "borrowed"))
              for s in late]
    assert all(x > 0.05 and abs(x - y) < 1e-9 for x, y in grants), grants  # equal weights
    # what they achieve: most of a's 20 points (the figure under no load is the benchmark's)
    assert b + c >= 0.85, (b, c)
    assert b >= 0.3 + 0.03 and c >= 0.5 + 0.03, (b, c)
    # a back: from the controller period that saw its first launch, within two periods
    # it holds its budget again (mean over the following half second, 2 points tolerance)
    first = next(i for i, s in enumerate(steps)
                 if float(s["t"]) > marks["back"] and bench.field_of(s, "a", "tokens") > 0)
    after = bench.measured(steps[first + 2:])[:5]
    assert bench.busy_fraction(after, "a") >= 0.18, [
        (bench.field_of(s, "a", "busy"), bench.field_of(s, "a", "seconds"))
        for s in steps[first: first + 8]]
    assert all(bench.field_of(s, "a", "lent") == 0 for s in steps[first + 1: first + 7])


def test_hard_cap_leaves_idle_capacity_idle(
    hook_built: None, tmp_path: Path, bench: ModuleType
) -> None:
    """Every quota opted out of lending: a's idle 20 % stays idle, b and c keep 30/50."""
    warm, idle = 3.0, 4.0

    def script(run: object, rec: dict[str, object]) -> None:
        if "a" in run.spinners and float(rec["t"]) >= warm:  # type: ignore[attr-defined, arg-type]
            run.stop("a")  # type: ignore[attr-defined]

    run = bench.scenario(tmp_path, BUDGETS, warm + idle, script, no_lend=("a", "b", "c"))
    late = [s for s in run.steps if warm + 1.5 <= float(s["t"]) < warm + idle - 0.2]  # type: ignore[arg-type]
    assert late
    b, c = (bench.busy_fraction(late, n) for n in ("b", "c"))
    assert abs(b - 0.30) <= 0.03 and abs(c - 0.50) <= 0.03, (b, c)
    assert all(bench.field_of(s, n, "borrowed") == 0 for s in late for n in ("b", "c"))


def test_mig_instance_split_by_tokens(
    hook_built: None, tmp_path: Path, bench: ModuleType
) -> None:
    """On a MIG instance NVML has no per-process (or instance) utilisation; the controller
    splits by the ledgers' token counts. Stated accuracy (docs/node-daemon.md): within 3
    points over 10 s when the containers' kernels cost the same on average, as here."""
    warm, measure = 3.0, 10.0
    run = bench.scenario(tmp_path, BUDGETS, warm + measure, lambda r, s: None, mig=True)
    assert run.mig and run.mig.startswith("MIG-")
    w = [s for s in run.steps if warm <= float(s["t"]) < warm + measure]  # type: ignore[arg-type]
    tokens = {n: sum(bench.field_of(s, n, "tokens") for s in w) for n in NAMES}
    total = sum(tokens.values())
    assert total > 0
    for n in NAMES:
        assert abs(100 * tokens[n] / total - BUDGETS[n]) <= 3.0, tokens
