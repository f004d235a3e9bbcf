"""Build the pinned control plane binaries from the Go module proxy, once, into the cache.

k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces staging modules), so
e2e/controlplane/ is a wrapper module that restates the replaces; one `go build` compiles all
five commands so shared packages compile once, together with tessera's reference programs
under cmd/ (parse-quantity: apimachinery's quantity parser, tessera's is tested against it).
A stamp next to the binaries records what was built, the module's own Go files included; a
matching stamp means nothing to do. A cold build takes tens of minutes on 2 cores, so
every stage reports what it is doing and how long it has been going.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tessera_e2e.controlplane.cache import Layout, default_layout
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.pins import (
    CONTAINERD_MODULE_DIR,
    CONTROLPLANE_MODULE,
    ETCD_MODULE,
    MODULE_DIR,
    RELEASES,
    Pins,
    containerd_module,
    load_containerd_version,
    load_go_directive,
    load_pins,
)
from tessera_e2e.paths import E2E

MIN_GO = (1, 24)
HEARTBEAT_S = 30.0

# Package path -> installed binary name. `go build -o DIR/` names a module-root command after
# its last path element, so etcd's `go.etcd.io/etcd/server/v3` would land as `server`.
PACKAGES: dict[str, str] = {
    ETCD_MODULE: "etcd",
    "k8s.io/kubernetes/cmd/kube-apiserver": "kube-apiserver",
    "k8s.io/kubernetes/cmd/kube-controller-manager": "kube-controller-manager",
    "k8s.io/kubernetes/cmd/kube-scheduler": "kube-scheduler",
    "k8s.io/kubernetes/cmd/kubectl": "kubectl",
    "k8s.io/kubernetes/cmd/kubelet": "kubelet",
    "k8s.io/kubernetes/cmd/kube-proxy": "kube-proxy",
}
REFERENCE_PROGRAMS: dict[str, str] = {
    # tessera's own reference programs, built against the same apimachinery (the current
    # release's wrapper module has them; the oldest release's does not need them)
    f"{CONTROLPLANE_MODULE}/cmd/parse-quantity": "parse-quantity",
}


def controlplane_packages(module_dir: Path) -> dict[str, str]:
    """What one wrapper module builds: the Kubernetes commands and etcd, and the reference
    programs whose source it has under cmd/."""
    own = {package: name for package, name in REFERENCE_PROGRAMS.items()
           if (module_dir / "cmd" / name).is_dir()}
    return {**PACKAGES, **own}
GO_OUTPUT_NAME = {ETCD_MODULE: "server"}
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")

_NETWORK_ERRORS = re.compile(
    r"dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout|"
    r"network is unreachable|proxyconnect|410 Gone|502 Bad Gateway|503 Service Unavailable"
)

Reporter = Callable[[str], None]


def stderr_reporter(line: str) -> None:
    print(f"[controlplane] {line}", file=sys.stderr, flush=True)


def version_ldflags(pins: Pins) -> str:
    """-X flags so binaries report their real version (else `v0.0.0-master+$Format:%H$`)."""
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={pins.kubernetes}",
            f"-X {package}.gitMajor=1",
            f"-X {package}.gitMinor={pins.kubernetes_minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


@dataclass(frozen=True)
class BuildInputs:
    """Everything that decides the control plane binaries' content; the stamp stores it."""

    pins: Pins
    go_sum_sha256: str
    ldflags: str
    sources_sha256: str = ""
    """The wrapper module's own Go files (tessera's reference programs)."""

    def as_json(self) -> dict[str, str]:
        return {
            "kubernetes": self.pins.kubernetes,
            "etcd": self.pins.etcd,
            "go_sum_sha256": self.go_sum_sha256,
            "ldflags": self.ldflags,
            "sources_sha256": self.sources_sha256,
        }


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sources_digest(module_dir: Path = MODULE_DIR) -> str:
    """One hash over the module's Go files, their paths included."""
    digest = hashlib.sha256()
    for path in sorted(module_dir.rglob("*.go")):
        digest.update(str(path.relative_to(module_dir)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_inputs(module_dir: Path = MODULE_DIR) -> BuildInputs:
    pins = load_pins(module_dir)
    return BuildInputs(pins=pins, go_sum_sha256=_sha256(module_dir / "go.sum"),
                       ldflags=version_ldflags(pins), sources_sha256=sources_digest(module_dir))


@dataclass(frozen=True)
class Product:
    """One wrapper module's build: what to compile, where it goes, how to check it."""

    title: str  # "Kubernetes v1.37.2 + etcd v3.7.0"
    module_dir: Path
    directory: Path  # in the cache: bin/, stamp.json, build.log
    packages: Mapping[str, str]  # Go package -> installed binary name
    ldflags: str
    inputs: Mapping[str, str]  # what the stamp must match
    versions: Mapping[str, tuple[tuple[str, ...], str]]  # binary -> (args, must print)
    cold_minutes: str  # for the start message, e.g. "7-15"

    @property
    def bin_dir(self) -> Path:
        return self.directory / "bin"

    @property
    def stamp(self) -> Path:
        return self.directory / "stamp.json"


def controlplane_product(layout: Layout, module_dir: Path = MODULE_DIR) -> Product:
    inputs = build_inputs(module_dir)
    pins = inputs.pins
    return Product(
        title=f"Kubernetes {pins.kubernetes} + etcd {pins.etcd}",
        module_dir=module_dir,
        directory=layout.bin_dir(pins).parent,
        packages=controlplane_packages(module_dir),
        ldflags=inputs.ldflags,
        inputs=inputs.as_json(),
        versions={
            "kube-apiserver": (("--version",), pins.kubernetes),
            "kubelet": (("--version",), pins.kubernetes),
            "kubectl": (("version", "--client"), pins.kubernetes),
            "etcd": (("--version",), pins.etcd.lstrip("v")),
        },
        cold_minutes="7-15",
    )


def containerd_product(layout: Layout, module_dir: Path = CONTAINERD_MODULE_DIR) -> Product:
    version = load_containerd_version(module_dir)
    module = containerd_module(module_dir)
    ldflags = f"-s -w -X {module}/version.Version={version}"
    return Product(
        title=f"containerd {version}",
        module_dir=module_dir,
        directory=layout.root / "containerd" / f"containerd-{version}",
        packages={f"{module}/cmd/{name}": name for name in CONTAINERD_BINARIES},
        ldflags=ldflags,
        inputs={"containerd": version, "go_sum_sha256": _sha256(module_dir / "go.sum"),
                "ldflags": ldflags},
        versions={"containerd": (("--version",), version)},
        cold_minutes="2-4",
    )


HELM_MODULE = "helm.sh/helm/v3"
HELM_MODULE_DIR = E2E / "helm"


def helm_product(layout: Layout, module_dir: Path = HELM_MODULE_DIR) -> Product:
    """helm, from its own wrapper module (e2e/helm/go.mod) into its own cache directory, so
    that neither its dependency versions nor its stamp touch the control plane's."""
    version = _required_module_version(module_dir, HELM_MODULE)
    # `helm template` and `helm lint` assume this Kubernetes version (the chart states a
    # kubeVersion): the current release's control plane, not helm's built-in default (1.20);
    # one helm for every release (the oldest's run would otherwise rebuild it).
    pins = load_pins(RELEASES["current"].controlplane)
    ldflags = (f"-s -w -X {HELM_MODULE}/internal/version.version={version} "
               f"-X {HELM_MODULE}/internal/version.gitTreeState=clean "
               f"-X {HELM_MODULE}/pkg/chartutil.k8sVersionMajor=1 "
               f"-X {HELM_MODULE}/pkg/chartutil.k8sVersionMinor={pins.kubernetes_minor}")
    return Product(
        title=f"helm {version}",
        module_dir=module_dir,
        directory=layout.root / "helm" / f"helm-{version}",
        packages={f"{HELM_MODULE}/cmd/helm": "helm"},
        ldflags=ldflags,
        inputs={"helm": version, "go_sum_sha256": _sha256(module_dir / "go.sum"),
                "ldflags": ldflags},
        versions={"helm": (("version", "--short"), version)},
        cold_minutes="2-5",
    )


KUEUE_MODULE = "sigs.k8s.io/kueue"
KUEUE_MODULE_DIR = E2E / "kueue"
KUEUE_VERSION_ARGS = ("--kubeconfig=/nonexistent/tessera-kueue-version-check",)
"""Kueue's manager has no --version: it logs its version ("Initializing" … gitVersion) before it
loads a kubeconfig, then exits on this missing one."""


def kueue_product(layout: Layout, module_dir: Path = KUEUE_MODULE_DIR) -> Product:
    """Kueue's controller-manager, from its own wrapper module (e2e/kueue/go.mod) into its own
    cache directory; its manifests (CRDs, webhooks) come from the same module (kueue.py)."""
    version = _required_module_version(module_dir, KUEUE_MODULE)
    package = f"{KUEUE_MODULE}/pkg/version"
    ldflags = (f"-s -w -X {package}.GitVersion={version} "
               f"-X {package}.GitCommit={version} -X {package}.BuildDate=unknown")
    return Product(
        title=f"Kueue {version}",
        module_dir=module_dir,
        directory=layout.root / "kueue" / f"kueue-{version}",
        packages={f"{KUEUE_MODULE}/cmd/kueue": "kueue"},
        ldflags=ldflags,
        inputs={"kueue": version, "go_sum_sha256": _sha256(module_dir / "go.sum"),
                "ldflags": ldflags},
        versions={"kueue": (KUEUE_VERSION_ARGS, version)},
        cold_minutes="4-8",
    )


def _required_module_version(module_dir: Path, module: str) -> str:
    for line in (module_dir / "go.mod").read_text().splitlines():
        fields = line.replace("require", "").split()
        if len(fields) >= 2 and fields[0] == module:
            return fields[1]
    raise ControlPlaneError(f"{module_dir / 'go.mod'} requires no {module}")


def product_up_to_date(product: Product) -> bool:
    """True when the stamp matches the inputs and every binary is there and executable."""
    try:
        stamp = json.loads(product.stamp.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stamp, dict) or stamp.get("inputs") != dict(product.inputs):
        return False
    return all(os.access(product.bin_dir / name, os.X_OK) for name in product.packages.values())


def is_up_to_date(layout: Layout, inputs: BuildInputs) -> bool:
    """The control plane's stamp matches `inputs` and every binary is there."""
    product = controlplane_product(layout)
    return product_up_to_date(replace(product, inputs=inputs.as_json()))


def parse_go_version(output: str) -> tuple[int, int] | None:
    """`go version go1.26.8 linux/amd64` -> (1, 26)."""
    match = re.search(r"\bgo(\d+)\.(\d+)", output)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_go(env: Mapping[str, str]) -> str:
    """The go command to use: $TESSERA_GO, else `go` on PATH, else /usr/local/go/bin/go."""
    candidates = [env.get("TESSERA_GO", "")]
    candidates.append(shutil.which("go", path=env.get("PATH", os.defpath)) or "")
    candidates.append("/usr/local/go/bin/go")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ControlPlaneError(
        "no Go toolchain found (need Go >= 1.24 to build kube-apiserver and etcd): install it "
        "from https://go.dev/dl/ and put `go` on PATH, or set TESSERA_GO=/path/to/go"
    )


def check_go_version(go: str, env: Mapping[str, str], minimum: tuple[int, int] = MIN_GO) -> str:
    result = subprocess.run(
        [go, "version"], env=dict(env), capture_output=True, text=True, check=False
    )
    version = parse_go_version(result.stdout)
    if result.returncode != 0 or version is None:
        raise ControlPlaneError(f"`{go} version` failed: {result.stderr.strip() or result.stdout}")
    if version < minimum:
        raise ControlPlaneError(
            f"{go} is Go {version[0]}.{version[1]}, too old (need Go >= "
            f"{minimum[0]}.{minimum[1]}): "
            "install a newer Go from https://go.dev/dl/ or set TESSERA_GO"
        )
    return result.stdout.strip()


def go_environment(base: Mapping[str, str]) -> dict[str, str]:
    """Static binaries (as upstream ships them), the local toolchain, go.mod never rewritten."""
    env = dict(base)
    env.update(
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",
        GOFLAGS="-mod=readonly -buildvcs=false",
    )
    return env


def _format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"


def _run_stage(
    name: str,
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    report: Reporter,
    progress_noun: str,
) -> float:
    """Run one go command, log its output, report a heartbeat; returns seconds taken."""
    started = time.monotonic()
    report(f"{name}: started ({' '.join(argv[1:3])} ...)")
    counted = 0
    with log_path.open("a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        done = threading.Event()

        def heartbeat() -> None:
            while not done.wait(HEARTBEAT_S):
                report(
                    f"{name}: {counted} {progress_noun} so far, "
                    f"{_format_elapsed(time.monotonic() - started)} elapsed"
                )

        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            log.write(line)
            counted += 1
            tail = [*tail[-19:], line.rstrip()]
        returncode = proc.wait()
        done.set()
        beat.join()
    elapsed = time.monotonic() - started
    if returncode != 0:
        text = "\n".join(tail)
        if _NETWORK_ERRORS.search(text):
            proxy = env.get("GOPROXY", "https://proxy.golang.org,direct")
            raise ControlPlaneError(
                f"{name} failed: cannot reach the Go module proxy (GOPROXY={proxy}); check the "
                f"network or GOPROXY and run `make controlplane` again; log: {log_path}"
            )
        last = next((line for line in reversed(tail) if line.strip()), "no output")
        raise ControlPlaneError(f"{name} failed (exit {returncode}): {last}; log: {log_path}")
    report(f"{name}: done in {_format_elapsed(elapsed)}")
    return elapsed


def _verify_versions(bin_dir: Path, product: Product) -> None:
    """The built binaries must report the pinned versions (ldflags took effect)."""
    for name, (args, want) in product.versions.items():
        result = subprocess.run(
            [str(bin_dir / name), *args], capture_output=True, text=True, check=False,
            timeout=60,
        )
        out = result.stdout + result.stderr  # Kueue logs its version to stderr
        if want not in out:
            raise ControlPlaneError(
                f"built {name} reports {out.strip()!r}, expected version {want}: "
                "check the -X ldflags in tessera_e2e/controlplane/build.py"
            )


def ensure_built(
    layout: Layout | None = None,
    *,
    module_dir: Path = MODULE_DIR,
    env: Mapping[str, str] | None = None,
    report: Reporter = stderr_reporter,
    force: bool = False,
) -> Path:
    """Build the control plane unless the stamp says it is current; returns its bin directory."""
    product = controlplane_product(layout or default_layout(), module_dir)
    return ensure_product(product, env=env, report=report, force=force)


def ensure_containerd(
    layout: Layout | None = None,
    *,
    env: Mapping[str, str] | None = None,
    report: Reporter = stderr_reporter,
    force: bool = False,
) -> Path:
    """Build containerd, its runc shim and ctr unless current; returns their bin directory."""
    product = containerd_product(layout or default_layout())
    return ensure_product(product, env=env, report=report, force=force)


def ensure_helm(
    layout: Layout | None = None,
    *,
    env: Mapping[str, str] | None = None,
    report: Reporter = stderr_reporter,
    force: bool = False,
) -> Path:
    """Build helm unless current; returns the path of the helm binary."""
    product = helm_product(layout or default_layout())
    return ensure_product(product, env=env, report=report, force=force) / "helm"


def ensure_kueue(
    layout: Layout | None = None,
    *,
    env: Mapping[str, str] | None = None,
    report: Reporter = stderr_reporter,
    force: bool = False,
) -> Path:
    """Build Kueue's controller-manager unless current; returns the path of the binary."""
    product = kueue_product(layout or default_layout())
    return ensure_product(product, env=env, report=report, force=force) / "kueue"


def ensure_product(
    product: Product,
    *,
    env: Mapping[str, str] | None = None,
    report: Reporter = stderr_reporter,
    force: bool = False,
) -> Path:
    if not force and product_up_to_date(product):
        report(f"up to date: {product.title} in {product.bin_dir}")
        return product.bin_dir
    product.directory.mkdir(parents=True, exist_ok=True)
    with (product.directory / ".lock").open("w") as lock:
        # Two sessions building at once would share bin.partial: the second waits, then
        # finds the stamp written by the first.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and product_up_to_date(product):
            report(f"built meanwhile by another process: {product.bin_dir}")
            return product.bin_dir
        return _build(product, env, report)


def _build(product: Product, env: Mapping[str, str] | None, report: Reporter) -> Path:
    bin_dir = product.bin_dir
    base_env = go_environment(env if env is not None else os.environ)
    go = find_go(base_env)
    go_version = check_go_version(go, base_env, load_go_directive(product.module_dir))
    log_path = product.directory / "build.log"
    log_path.write_text(f"{go_version}\n")
    staging = product.directory / "bin.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    report(
        f"building {product.title} with {go_version.split()[2]} into {bin_dir} (a cold build "
        f"takes ~{product.cold_minutes} min on 2 cores; log: {log_path})"
    )
    times: dict[str, float] = {}
    times["download modules"] = _run_stage(
        "stage 1/3 download modules", [go, "mod", "download", "-x"],
        cwd=product.module_dir, env=base_env, log_path=log_path, report=report,
        progress_noun="log lines",
    )
    times["compile and link"] = _run_stage(
        "stage 2/3 compile and link", [
            go, "build", "-v", "-trimpath", "-ldflags", product.ldflags,
            "-o", f"{staging}/", *product.packages,
        ],
        cwd=product.module_dir, env=base_env, log_path=log_path, report=report,
        progress_noun="packages compiled",
    )
    started = time.monotonic()
    for package, name in product.packages.items():
        built = staging / GO_OUTPUT_NAME.get(package, name)
        if built != staging / name:
            built.rename(staging / name)
    _verify_versions(staging, product)
    shutil.rmtree(bin_dir, ignore_errors=True)
    staging.rename(bin_dir)
    sizes = {name: (bin_dir / name).stat().st_size for name in product.packages.values()}
    times["verify and install"] = time.monotonic() - started
    product.stamp.write_text(json.dumps({
        "inputs": dict(product.inputs),
        "go": go_version,
        "stage_seconds": {k: round(v, 1) for k, v in times.items()},
        "sizes_bytes": sizes,
    }, indent=2) + "\n")
    report(f"stage 3/3 verify and install: done in {_format_elapsed(times['verify and install'])}")
    report("sizes: " + ", ".join(f"{n} {s / 2**20:.0f} MiB" for n, s in sizes.items()))
    report(f"built in {_format_elapsed(sum(times.values()))}: {bin_dir}")
    return bin_dir
