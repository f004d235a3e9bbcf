"""``tessera mig``: what a person or a script sees on stdout, stderr and in the exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mig_oracle import is_valid_state, maximal

from tessera_operator.cli.main import main

TESSERA = Path(sys.executable).parent / "tessera"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_places_the_3g_at_slot_4(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "mig", "plan", "--gpu", "H100-80GB",
                         "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb", "--json")
    assert (code, err) == (0, "")
    placements = json.loads(out)["placements"]
    assert {"profile": "3g.40gb", "start": 4, "size": 4} in placements
    assert is_valid_state("H100-80GB", [(p["profile"], p["start"]) for p in placements])


def test_plan_table_shows_explicit_nvidia_smi_placements(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "mig", "plan", "--gpu", "A100-40GB", "3g.20gb", "4g.20gb")
    assert code == 0
    assert out.splitlines()[0].split() == ["PROFILE", "START", "SLICES", "NVIDIA-SMI"]
    assert "-cgi 5:0" in out and "-cgi 9:4" in out


def test_plan_with_current_prints_minimal_steps(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "plan", "--gpu", "H100-80GB", "3g.40gb", "3g.40gb",
                       "--current", "3g.40gb@4,1g.10gb@0,1g.10gb@1", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["kept"] == [{"profile": "3g.40gb", "start": 4}]
    assert [(s["action"], s["profile"], s["start"]) for s in result["steps"]] == [
        ("destroy", "1g.10gb", 0), ("destroy", "1g.10gb", 1), ("create", "3g.40gb", 0)
    ]


def test_busy_instance_waits_or_refuses(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["mig", "plan", "--gpu", "H100-80GB", "3g.40gb", "3g.40gb", "--busy", "7g.80gb@0"]
    code, out, _ = run(capsys, *args)
    assert code == 0 and out.startswith("waiting: busy instance(s) 7g.80gb@0")
    code, out, err = run(capsys, *args, "--policy", "refuse")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "7g.80gb@0" in err


def test_layouts_json_is_every_maximal_layout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "layouts", "--gpu", "B200-180GB", "--json")
    layouts = json.loads(out)
    assert code == 0 and all(layout == sorted(layout) for layout in layouts)
    assert {tuple(layout) for layout in layouts} == maximal("B200-180GB", False)
    assert len(layouts) == 28


def test_models_lists_every_model_with_its_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "mig", "models", "--json")
    models = {m["id"]: m for m in json.loads(out)}
    assert code == 0 and len(models) == 8
    assert "1g.10gb" in models["A100-40GB"]["profiles"]
    assert models["A30-24GB"]["memorySlices"] == 4


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["mig", "plan", "--gpu", "T4", "1g.5gb"], "unknown GPU model 'T4'"),
        (["mig", "plan", "--gpu", "A30-24GB", "1g.5gb"], "valid profiles: 1g.6gb"),
        (["mig", "plan", "--gpu", "A30-24GB", "4g.24gb", "1g.6gb"], "memory slices run out"),
        (["mig", "plan", "--gpu", "H100-80GB", "7g.80gb", "--current", "4g"], "PROFILE@START"),
        (["mig", "plan", "--gpu", "H100-80GB", "7g.80gb", "--current", "4g.40gb@0,3g.40gb@0"],
         "overlaps"),
        (["mig", "layouts", "--gpu", "nope"], "unknown GPU model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_installed_entry_point_plans_and_rejects() -> None:
    assert TESSERA.exists(), f"{TESSERA} missing: install the package (make install)"
    ok = subprocess.run([str(TESSERA), "mig", "layouts", "--gpu", "A30-24GB", "--json"],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and len(json.loads(ok.stdout)) == 4
    bad = subprocess.run([str(TESSERA), "mig", "plan", "--gpu", "H100-80GB", "4g.40gb",
                          "4g.40gb"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "tessera: layout 2x4g.40gb has 2x 4g.40gb but at most 1 fit on H100-80GB "
        "(the profile's maximum count)"
    ]
