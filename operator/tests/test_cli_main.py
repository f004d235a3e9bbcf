"""The CLI's contract for bad input: one line on stderr, exit status 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tessera_operator.cli.main import main

TESSERA = Path(sys.executable).parent / "tessera"


def test_unknown_command_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "frobnicate" in err and "Traceback" not in err


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "required" in capsys.readouterr().err


def test_installed_entry_point_exits_2_on_bad_input() -> None:
    assert TESSERA.exists(), f"{TESSERA} missing: install the package (make install)"
    proc = subprocess.run([str(TESSERA), "no-such-command"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("args", "says"), [
    (["--webhook-url", "http://127.0.0.1:9443"], "--webhook-url must be https://HOST[:PORT]"),
    (["--lease-duration", "4", "--lease-renew", "2"],
     "--lease-duration must be more than twice --lease-renew"),
    (["--webhook-client-name", "kube-apiserver"],
     "--webhook-client-name needs --webhook-client-ca"),
    (["--webhook-client-ca", "/no/such/ca.crt"],
     "--webhook-client-ca '/no/such/ca.crt' is not a file"),
    (["--recount-interval", "0"], "--recount-interval must be positive"),
    (["--cert-lifetime", "30"], "lengthen the lifetime"),
    (["--cert-step", "10", "--cert-check-interval", "60"], "at least twice the check interval"),
    (["--webhook-certificate", "external", "--cert-check-interval", "0"],
     "--cert-check-interval must be positive"),
    (["--shutdown-drain", "-1"], "--shutdown-drain must be 0 or more"),
])
def test_operator_run_refuses_bad_flags_before_starting(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operator", "run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err
