"""The build's decisions: pinned versions, stamps, and its one-line failures."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tessera_e2e.controlplane.build import (
    build_inputs,
    containerd_product,
    controlplane_packages,
    ensure_built,
    find_go,
    is_up_to_date,
    parse_go_version,
    sources_digest,
    version_ldflags,
)
from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.pins import (
    MODULE_DIR,
    RELEASES,
    containerd_major,
    containerd_module,
    load_containerd_version,
    load_pins,
    parse_pins,
    selected_release,
)

GO_MOD = """module x
go 1.24.0
require (
\tgo.etcd.io/etcd/server/v3 v3.6.4
\tk8s.io/kubernetes v1.34.4
)
replace (
\tk8s.io/api => k8s.io/api v0.34.4
\tk8s.io/kubectl => k8s.io/kubectl {kubectl}
)
"""


def test_pins_come_from_the_wrapper_go_mod() -> None:
    """The current release: Kubernetes 1.37 with the etcd it requires, containerd 2.3; the
    oldest supported: 1.34 with containerd 1.7 (e2e/README.md, "Kubernetes releases")."""
    pins = load_pins(RELEASES["current"].controlplane)
    assert pins.kubernetes.startswith("v1.37.") and pins.kubernetes_minor == "37"
    assert pins.etcd.startswith("v3.7.")
    oldest = load_pins(RELEASES["oldest"].controlplane)
    assert oldest.kubernetes.startswith("v1.34.") and oldest.etcd.startswith("v3.6.")
    assert load_containerd_version(RELEASES["current"].containerd).startswith("v2.3.")
    assert load_containerd_version(RELEASES["oldest"].containerd).startswith("v1.7.")


def test_containerd_2_and_1_build_from_their_own_module_paths(tmp_path: Path) -> None:
    current, oldest = RELEASES["current"].containerd, RELEASES["oldest"].containerd
    assert containerd_module(current) == "github.com/containerd/containerd/v2"
    assert containerd_module(oldest) == "github.com/containerd/containerd"
    assert containerd_major("v2.3.7") == 2 and containerd_major("v1.7.35") == 1
    product = containerd_product(Layout(tmp_path), current)
    assert "github.com/containerd/containerd/v2/cmd/containerd" in product.packages
    assert "-X github.com/containerd/containerd/v2/version.Version=v2." in product.ldflags


def test_the_release_is_chosen_by_name_and_a_wrong_name_says_which_exist() -> None:
    assert selected_release({}).name == "current"
    assert selected_release({"TESSERA_KUBERNETES": "oldest"}).name == "oldest"
    with pytest.raises(ValueError, match="current, oldest"):
        selected_release({"TESSERA_KUBERNETES": "1.30"})


def test_a_staging_replace_at_another_version_is_refused() -> None:
    assert parse_pins(GO_MOD.format(kubectl="v0.34.4")).kubernetes == "v1.34.4"
    with pytest.raises(ValueError, match=r"k8s.io/kubectl with v0.34.3.*needs v0.34.4"):
        parse_pins(GO_MOD.format(kubectl="v0.34.3"))


def test_ldflags_set_the_real_version_for_server_and_client() -> None:
    flags = version_ldflags(load_pins(RELEASES["current"].controlplane))
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.37." in flags
        assert f"-X {package}.gitMinor=37" in flags


def test_parse_go_version() -> None:
    assert parse_go_version("go version go1.26.8 linux/amd64") == (1, 26)
    assert parse_go_version("garbage") is None


def _fake_build(layout: Layout) -> None:
    inputs = build_inputs()
    bin_dir = layout.bin_dir(inputs.pins)
    bin_dir.mkdir(parents=True)
    for name in controlplane_packages(MODULE_DIR).values():
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    layout.stamp(inputs.pins).write_text(json.dumps({"inputs": inputs.as_json()}))


def test_stamp_decides_whether_to_rebuild(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    inputs = build_inputs()
    assert not is_up_to_date(layout, inputs)
    _fake_build(layout)
    assert is_up_to_date(layout, inputs)
    changed = type(inputs)(inputs.pins, "0" * 64, inputs.ldflags,
                           inputs.sources_sha256)  # go.sum changed
    assert not is_up_to_date(layout, changed)
    edited = type(inputs)(inputs.pins, inputs.go_sum_sha256, inputs.ldflags,
                          "0" * 64)  # a reference program changed
    assert not is_up_to_date(layout, edited)
    (layout.bin_dir(inputs.pins) / "etcd").unlink()
    assert not is_up_to_date(layout, inputs)


def test_an_up_to_date_build_runs_no_go(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    _fake_build(layout)
    lines: list[str] = []
    env = {"PATH": str(tmp_path / "nowhere")}  # no go at all: must not be needed
    assert ensure_built(layout, env=env, report=lines.append) == layout.bin_dir(
        build_inputs().pins
    )
    assert lines and lines[0].startswith("up to date")


def test_no_go_toolchain_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ControlPlaneError, match=r"no Go toolchain found .* TESSERA_GO"):
        find_go({"PATH": str(tmp_path)})


def test_unreachable_module_proxy_is_one_clear_line(tmp_path: Path) -> None:
    try:
        go = find_go(os.environ)
    except ControlPlaneError as exc:
        pytest.fail(f"needs a Go toolchain: {exc}")
    env = dict(os.environ)
    env.update(
        TESSERA_GO=go,
        GOPROXY="http://127.0.0.1:9",  # nothing listens on the discard port
        GOMODCACHE=str(tmp_path / "modcache"),  # empty: every module must be fetched
        GOSUMDB="off",
    )
    with pytest.raises(ControlPlaneError) as caught:
        ensure_built(Layout(tmp_path / "cache"), env=env, force=True, report=lambda _: None)
    message = str(caught.value)
    assert "cannot reach the Go module proxy (GOPROXY=http://127.0.0.1:9)" in message
    assert "build.log" in message and "\n" not in message
    # the module cache is read-only by design; make it removable for tmp_path cleanup
    for root, dirs, _ in os.walk(tmp_path / "modcache"):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(tmp_path / "modcache", ignore_errors=True)


def test_wrapper_go_sum_is_committed_next_to_go_mod() -> None:
    assert (MODULE_DIR / "go.sum").stat().st_size > 0


def test_the_reference_programs_are_built_and_stamped(tmp_path: Path) -> None:
    """parse-quantity is built with the control plane; its source decides the stamp."""
    packages = controlplane_packages(MODULE_DIR)
    assert packages["tessera.dev/e2e/controlplane/cmd/parse-quantity"] == "parse-quantity"
    assert "parse-quantity" not in controlplane_packages(RELEASES["oldest"].controlplane).values()
    module = tmp_path / "module"
    shutil.copytree(MODULE_DIR, module)
    before = sources_digest(module)
    assert before == build_inputs().sources_sha256
    main = module / "cmd" / "parse-quantity" / "main.go"
    main.write_text(main.read_text() + "\n// changed\n")
    assert sources_digest(module) != before
