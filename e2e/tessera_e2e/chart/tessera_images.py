"""tessera's own images, the operator and the node daemon: no Docker daemon, no registry.

The recipe (the same one `images/Dockerfile` states for people who build with Docker):

1. **base** layer: Debian bookworm's packages for a Python 3.11 runtime (``DEBIAN_PACKAGES``),
   fetched with ``apt-get download`` and unpacked with ``dpkg-deb`` (no maintainer scripts:
   these packages need none to run), without their documentation;
2. **app** layer: the process's wheels -- tessera-core and tessera-operator, or tessera-core
   and tessera-node -- and their dependencies' wheels, installed from PyPI by pip into
   Debian's ``dist-packages`` (versions constrained to the ones the checkout's virtual
   environment was tested with): each image holds only what its process imports;
3. node daemon only: ``libtessera.so`` (hook/build) at ``/opt/tessera/lib``, which the
   daemon installs at start into a host directory versioned by its content.

The operator image runs as UID 65532; the node daemon's needs root (charts/tessera/README.md,
"Privileges").
Both images share their base layer, so a node's containerd stores it once.

Reproducible as the test images are (``images.layer_tar``: fixed metadata, sorted entries,
uncompressed layers): the same ``.deb`` files, wheels and libtessera give the same digest.
Before it is written, each image's file tree is unpacked and its Python must import the
program (``chroot``), so an image missing a library fails here, not in a pod.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.nodes.images import REPOSITORY, Image, ImageFile, layer_tar, oci_layered_archive
from tessera_e2e.paths import REPO

OPERATOR_IMAGE = f"{REPOSITORY}/tessera-operator"
NODE_IMAGE = f"{REPOSITORY}/tessera-node"
PYTHON = "/usr/bin/python3.11"
SITE_PACKAGES = "usr/lib/python3/dist-packages"
LIBTESSERA = "opt/tessera/lib/libtessera.so"
OPERATOR_UID = 65532
APP_VERSION = yaml.safe_load((REPO / "charts" / "tessera" / "Chart.yaml").read_text())[
    "appVersion"]
"""The tag `make images` gives (the chart's appVersion, its default image tag)."""
# A Python 3.11 runtime and the C libraries its extension modules (and grpcio's, pydantic's,
# cryptography's) load; dbm, nis, readline and curses are left out (tessera uses none).
DEBIAN_PACKAGES = (
    "libc6", "libgcc-s1", "libstdc++6", "zlib1g", "libexpat1", "libssl3", "libffi8",
    "libbz2-1.0", "liblzma5", "libsqlite3-0", "libcrypt1", "libuuid1", "media-types",
    "libpython3.11-minimal", "python3.11-minimal", "libpython3.11-stdlib",
)
LEFT_OUT = ("usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/",
            "usr/share/locale/", "usr/share/bug/")
ENTRYPOINTS = {
    OPERATOR_IMAGE: ["tessera_operator.cli.main"],
    NODE_IMAGE: ["tessera_node.cli"],
}
PROJECTS = {
    OPERATOR_IMAGE: (REPO / "core", REPO / "operator"),
    NODE_IMAGE: (REPO / "core", REPO / "node-daemon"),
}
"""The distributions each image installs (each a pyproject.toml of its own)."""


@dataclass(frozen=True)
class BuiltImage:
    image: Image
    seconds: float
    """Time to build it (0 when the cached tarball of identical inputs was reused)."""
    size_bytes: int
    """The uncompressed layers' size (what a node stores)."""


def _run(argv: list[str], what: str, cwd: Path | None = None,
         env: Mapping[str, str] | None = None) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"{what} failed ({' '.join(argv[:4])} ...): "
                                f"{(result.stderr or result.stdout).strip()[-800:]}")
    return result.stdout


def fetch_debs(directory: Path) -> list[Path]:
    """The .deb of every package in ``DEBIAN_PACKAGES``, the candidate version apt knows
    (downloaded once into ``directory``; a newer candidate is downloaded beside it)."""
    directory.mkdir(parents=True, exist_ok=True)
    wanted = _run(["apt-cache", "show", "--no-all-versions", *DEBIAN_PACKAGES],
                  "apt-cache show (run `apt-get update` once)")
    files = []
    for stanza in wanted.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        version = fields["Version"].replace(":", "%3a")  # how apt-get download names it
        files.append(f"{fields['Package']}_{version}_{fields['Architecture']}.deb")
    missing = [name for name, file in zip(DEBIAN_PACKAGES, files, strict=True)
               if not (directory / file).exists()]
    if missing:
        _run(["apt-get", "download", *missing], "apt-get download", cwd=directory)
    paths = [directory / file for file in files]
    for path in paths:
        if not path.exists():
            raise ControlPlaneError(f"apt-get download did not write {path}")
    return paths


def deb_files(deb: Path) -> dict[str, ImageFile]:
    """A package's files as image files (``dpkg-deb --fsys-tarfile``), documentation left
    out; hard links become copies."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True,
                          check=False)
    if data.returncode != 0:
        raise ControlPlaneError(f"dpkg-deb {deb.name}: {data.stderr.decode()[-300:]}")
    files: dict[str, ImageFile] = {}
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        for member in tar:
            name = os.path.normpath(member.name).lstrip("./")
            if not name or name == "." or any(name.startswith(p) for p in LEFT_OUT):
                continue
            mode = member.mode & 0o7777
            if member.isdir():
                files[name] = ImageFile(mode=mode)
            elif member.issym():
                files[name] = ImageFile(link=member.linkname)
            elif member.islnk():
                target = os.path.normpath(member.linkname).lstrip("./")
                files[name] = ImageFile(files[target].data, mode)
            elif member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                files[name] = ImageFile(extracted.read(), mode)
    return files


def base_files(debs: list[Path]) -> dict[str, ImageFile]:
    files: dict[str, ImageFile] = {}
    for deb in debs:
        files.update(deb_files(deb))
    files["etc/passwd"] = ImageFile(b"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    b"tessera:x:65532:65532:tessera:/nonexistent:"
                                    b"/usr/sbin/nologin\n")
    files["etc/group"] = ImageFile(b"root:x:0:\ntessera:x:65532:\n")
    files["tmp"] = ImageFile(mode=0o1777)
    files["root"] = ImageFile(mode=0o700)
    return files


def constraints(python: Path) -> str:
    """``pip freeze`` of the environment the tests run in: the image gets the same versions."""
    frozen = _run([str(python), "-m", "pip", "freeze", "--exclude-editable"], "pip freeze")
    return "".join(line + "\n" for line in frozen.splitlines()
                   if line and not line.startswith(("-e ", "#")))


def app_files(python: Path, work: Path, projects: Sequence[Path]) -> dict[str, ImageFile]:
    """The ``projects``' wheels and their dependencies, as installed into Debian's
    dist-packages."""
    wheels, target = work / "wheels", work / "site"
    shutil.rmtree(wheels, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    (work / "constraints.txt").write_text(constraints(python))
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "SOURCE_DATE_EPOCH": "0"}
    _run([str(python), "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
          str(wheels), *map(str, projects)], "building tessera's wheels", env=env)
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-compile", "--only-binary=:all:",
          "--target", str(target), "--constraint", str(work / "constraints.txt"),
          "--find-links", str(wheels), *map(str, sorted(wheels.glob("*.whl")))],
         "pip install into the image (PyPI)", env=env)
    files: dict[str, ImageFile] = {}
    for path in sorted(target.rglob("*")):
        relative = path.relative_to(target)
        if (relative.parts[0] == "bin" or "__pycache__" in relative.parts
                or relative.name == "direct_url.json"):
            continue  # scripts name this machine's python; direct_url.json this checkout
        name = f"{SITE_PACKAGES}/{relative}"
        if path.is_symlink():
            files[name] = ImageFile(link=os.readlink(path))
        elif path.is_dir():
            files[name] = ImageFile(mode=0o755)
        else:
            data = path.read_bytes()
            if relative.name == "RECORD":  # it lists direct_url.json with its hash
                data = b"".join(line for line in data.splitlines(keepends=True)
                                if b"/direct_url.json," not in line)
            executable = path.stat().st_mode & 0o111
            files[name] = ImageFile(data, 0o755 if executable else 0o644)
    return files


def libtessera_files(hook_build: Path) -> dict[str, ImageFile]:
    path = hook_build / "libtessera.so"
    if not path.is_file():
        raise ControlPlaneError(f"{path} is missing: run `make hook`")
    return {LIBTESSERA: ImageFile(path.read_bytes(), 0o755)}


def check_runs(layers: Sequence[Mapping[str, ImageFile]], module: str, work: Path) -> None:
    """Unpack the layers and import ``module`` with the image's own Python (chroot, root)."""
    root = work / "rootfs"
    for files in layers:
        with tarfile.open(fileobj=io.BytesIO(layer_tar(files))) as tar:
            tar.extractall(root, filter="tar")
    _run(["chroot", str(root), PYTHON, "-c", f"import {module}"],
         f"the image's Python importing {module}")
    shutil.rmtree(root)


def _inputs_digest(debs: list[Path], python: Path, hook_build: Path, tag: str) -> str:
    digest = hashlib.sha256(tag.encode() + b"\0")
    for deb in debs:
        digest.update(deb.name.encode() + b"\0")
    digest.update(constraints(python).encode())
    sources = [hook_build.resolve() / "libtessera.so"]
    for project in sorted({p for projects in PROJECTS.values() for p in projects}):
        sources += [project / "pyproject.toml", *sorted(project.rglob("tessera*/**/*.py"))]
    for path in sources:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def ensure_tessera_images(layout: Layout, python: Path, hook_build: Path, tag: str
                          ) -> dict[str, BuiltImage]:
    """Both images tagged ``tag`` (built, or the cached tarballs of identical inputs)."""
    directory = layout.root / "tessera-images"
    debs = fetch_debs(directory / "debs")
    key = _inputs_digest(debs, python, hook_build, tag)
    index = directory / f"{key}.json"
    if index.exists():
        known = json.loads(index.read_text())
        if all(Path(entry["archive"]).exists() for entry in known.values()):
            return {ref: BuiltImage(Image(ref=ref, digest=e["digest"], archive=Path(e["archive"])),
                                    0.0, e["size_bytes"]) for ref, e in known.items()}
    built: dict[str, BuiltImage] = {}
    with tempfile.TemporaryDirectory(prefix="tessera-app-image-") as scratch:
        started = time.monotonic()
        base = base_files(debs)
        node_lib = libtessera_files(hook_build)
        shared = time.monotonic() - started
        for name, extra, user in ((OPERATOR_IMAGE, [], f"{OPERATOR_UID}"),
                                  (NODE_IMAGE, [node_lib], "0")):
            began = time.monotonic()
            layers = [base, app_files(python, Path(scratch), PROJECTS[name]), *extra]
            ref = f"{name}:{tag}"
            module = ENTRYPOINTS[name][0]
            check_runs(layers, module, Path(scratch))
            tars = [layer_tar(files) for files in layers]
            digest, archive = oci_layered_archive(ref, tars, {
                "Entrypoint": [PYTHON, "-m", module],
                "User": f"{user}:{user}",
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1",
                        "PYTHONUNBUFFERED=1"],
                "Labels": {"org.opencontainers.image.version": tag,
                           "org.opencontainers.image.title": name.rsplit("/", 1)[1]},
            })
            path = directory / f"{name.rsplit('/', 1)[1]}-{digest[7:19]}.tar"
            partial = path.with_suffix(".partial")
            partial.write_bytes(archive)
            partial.rename(path)
            built[ref] = BuiltImage(Image(ref=ref, digest=digest, archive=path),
                                    round(shared + time.monotonic() - began, 1),
                                    sum(len(t) for t in tars))
    index.write_text(json.dumps({ref: {"digest": b.image.digest, "archive": str(b.image.archive),
                                       "size_bytes": b.size_bytes}
                                 for ref, b in built.items()}, indent=2) + "\n")
    return built
