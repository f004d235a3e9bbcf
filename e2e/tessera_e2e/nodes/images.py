"""Container images for the test bed's nodes, built from local files: no registry, no Docker.

Two images, each written as an OCI image layout tarball (`oci-layout`, `index.json`,
`blobs/sha256/...`) that `ctr -n k8s.io images import` loads into a node's containerd:

- `pause`: the pod sandbox, our own statically linked `pause.c` (what Kubernetes' pause does);
- `workload`: Debian's static busybox (sh, sleep, wget, httpd, nc, ...) for plain pods, the
  C library's runtime files, Debian's `openssl` (the TLS that busybox wget uses for https),
  test CUDA programs (`cuda-info`, `cuda-alloc`, `cuda-spin`, and the NVML client
  `nvml-info`) and the simulator's `nvidia-smi` (sim/tools/smi/, at /usr/bin/nvidia-smi
  where the NVIDIA container toolkit mounts the real one), linked against `libcuda.so.1`
  (`libnvidia-ml.so.1`) but not carrying it: like a real CUDA container they get it from
  what the node mounts (the image's LD_LIBRARY_PATH names /usr/local/nvidia/lib64, the CUDA
  base images' convention).

Reproducible: every file's metadata is fixed (mtime 0, owner root, mode 0755/0644), entries are
sorted, layers are uncompressed tars and JSON is canonical, so the same inputs give the same
digest. The tarballs are cached under the cache's images/ by a hash of their inputs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.paths import E2E, REPO

SOURCES = E2E / "images"
SMI_SOURCES = REPO / "sim" / "tools" / "smi"  # the simulator's nvidia-smi, in C
REPOSITORY = "tessera.local"
PAUSE = f"{REPOSITORY}/pause:1"
WORKLOAD = f"{REPOSITORY}/workload:1"
# Where a node mounts the (simulated) driver's libraries into a GPU container.
DRIVER_LIBRARY_DIR = "/usr/local/nvidia/lib64"
BUSYBOX = Path("/usr/bin/busybox")  # Debian's busybox-static
BUSYBOX_APPLETS = (
    "sh", "cat", "echo", "env", "grep", "hostname", "httpd", "id", "ls", "mkdir", "nc",
    "ps", "sleep", "test", "true", "false", "wget", "date", "head", "tail", "wc", "kill",
    "timeout", "printf",
    "ssl_client",  # what busybox wget runs for https://
    # what a tenant tries on tessera's files (e2e/tests/system/test_node_attacks.py)
    "rm", "dd", "base64", "unshare", "mount", "truncate",
)
OPENSSL = (  # Debian's openssl: busybox wget runs `openssl s_client` for https:// when it
    # finds one; its own TLS client sends no signature_algorithms, which Go 1.25+ servers
    # refuse by default (RFC 9155; GODEBUG tlssha1): Kubernetes 1.37's API server among them
    ("/usr/bin/openssl", "bin/openssl"),
    ("/lib/x86_64-linux-gnu/libssl.so.3", "lib/x86_64-linux-gnu/libssl.so.3"),
    ("/lib/x86_64-linux-gnu/libcrypto.so.3", "lib/x86_64-linux-gnu/libcrypto.so.3"),
)
C_LIBRARY = (  # the glibc runtime a dynamically linked program needs
    ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
    ("/lib/x86_64-linux-gnu/libc.so.6", "lib/x86_64-linux-gnu/libc.so.6"),
    ("/lib/x86_64-linux-gnu/libm.so.6", "lib/x86_64-linux-gnu/libm.so.6"),
    ("/lib/x86_64-linux-gnu/libpthread.so.0", "lib/x86_64-linux-gnu/libpthread.so.0"),
    ("/lib/x86_64-linux-gnu/libdl.so.2", "lib/x86_64-linux-gnu/libdl.so.2"),
    ("/lib/x86_64-linux-gnu/librt.so.1", "lib/x86_64-linux-gnu/librt.so.1"),
)
CUDA_PROGRAMS = ("cuda-info", "cuda-alloc", "cuda-spin", "cuda-raw")
NVML_PROGRAMS = ("nvml-info",)
STALE_AFTER_S = 3600.0
CFLAGS = ("-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-s", "-Wl,--build-id=sha1")


@dataclass(frozen=True)
class ImageFile:
    """One file in a layer: its bytes (None for a directory), mode, or a symlink target."""

    data: bytes | None = None
    mode: int = 0o644
    link: str | None = None


@dataclass(frozen=True)
class Image:
    """A built image: its reference (`tessera.local/pause:1`), manifest digest and tarball."""

    ref: str
    digest: str
    archive: Path


def _canonical(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(files: Mapping[str, ImageFile]) -> bytes:
    """An uncompressed layer with fixed metadata; parent directories are added."""
    entries: dict[str, ImageFile] = {}
    for path in files:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            entries.setdefault("/".join(parts[:depth]), ImageFile(mode=0o755))
    entries.update(files)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            item = entries[path]
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = item.mode
            if item.link is not None:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, item.link, 0o777
                tar.addfile(info)
            elif item.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(item.data)
                tar.addfile(info, io.BytesIO(item.data))
    return buffer.getvalue()


def oci_archive(ref: str, files: Mapping[str, ImageFile], config: Mapping[str, object]
                ) -> tuple[str, bytes]:
    """(manifest digest, OCI image layout tarball) of a one-layer linux/amd64 image."""
    return oci_layered_archive(ref, [layer_tar(files)], config)


def oci_layered_archive(ref: str, layers: Sequence[bytes], config: Mapping[str, object]
                        ) -> tuple[str, bytes]:
    """(manifest digest, OCI image layout tarball) of a linux/amd64 image of ``layers``
    (uncompressed layer tars, bottom first): images that share their lower layers share
    those blobs in containerd's content store."""
    image_config = _canonical({
        "architecture": "amd64",
        "os": "linux",
        "config": dict(config),
        "rootfs": {"type": "layers", "diff_ids": [_sha256(layer) for layer in layers]},
    })
    manifest = _canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _sha256(image_config), "size": len(image_config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _sha256(layer), "size": len(layer)} for layer in layers],
    })
    index = _canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": _sha256(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]},
        }],
    })
    archive = {
        "oci-layout": _canonical({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{f"blobs/sha256/{_sha256(blob)[7:]}": blob for blob in (*layers, image_config,
                                                                   manifest)},
    }
    return _sha256(manifest), layer_tar({path: ImageFile(data) for path, data in archive.items()})


def _compile(source: Path, output: Path, extra: list[str], more: Sequence[Path] = ()) -> None:
    """``source`` and ``more`` (files of the same folder) into ``output``."""
    result = subprocess.run(
        ["cc", *CFLAGS, f"-ffile-prefix-map={source.parent}=.", "-o", str(output), str(source),
         *map(str, more), *extra],
        capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"compiling {source.name} failed: {result.stderr.strip()[:500]}")


def _cuda_include() -> Path:
    """cuda.h of the pinned wheel nvidia-cuda-runtime-cu12 (a dev dependency, as for sim/)."""
    return _wheel_include("nvidia.cuda_runtime", "nvidia-cuda-runtime-cu12")


def _wheel_include(module: str, wheel: str) -> Path:
    """The include folder of a pinned NVIDIA header wheel (cuda.h, nvml.h)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ControlPlaneError(f"{wheel} is not installed: run `make install`")
    return Path(next(iter(spec.submodule_search_locations))) / "include"


def _required(path: Path, hint: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        raise ControlPlaneError(f"{path} is missing: {hint}") from None


def image_contents(sim_lib: Path, work: Path) -> dict[str, tuple[Mapping[str, ImageFile],
                                                                  Mapping[str, object]]]:
    """Each image's files and config, compiling the C programs into `work`."""
    _compile(SOURCES / "pause.c", work / "pause", ["-static"])
    include = _cuda_include()
    for program in CUDA_PROGRAMS:
        # Linked against the simulator's libcuda.so for its soname only (NEEDED libcuda.so.1,
        # no rpath): at run time the library is whatever the node mounts.
        _compile(SOURCES / f"{program}.c", work / program,
                 [f"-I{include}", f"-L{sim_lib}", "-lcuda"])
    nvml = [f"-I{_wheel_include('nvidia.nvml_dev', 'nvidia-nvml-dev-cu12')}",
            f"-L{sim_lib}", "-lnvidia-ml"]
    for program in NVML_PROGRAMS:  # the same for libnvidia-ml.so.1
        _compile(SOURCES / f"{program}.c", work / program, nvml)
    smi = sorted(SMI_SOURCES.glob("*.c"))
    _compile(smi[0], work / "nvidia-smi", [*nvml, "-ldl"], smi[1:])
    pause = {"pause": ImageFile((work / "pause").read_bytes(), 0o755)}
    busybox = _required(BUSYBOX, "install Debian's busybox-static (`make sysdeps`)")
    workload: dict[str, ImageFile] = {"bin/busybox": ImageFile(busybox, 0o755)}
    workload.update({f"bin/{applet}": ImageFile(link="busybox") for applet in BUSYBOX_APPLETS})
    for host, inside in C_LIBRARY:
        workload[inside] = ImageFile(_required(Path(host), "the C library is Debian's libc6"),
                                     0o755)
    for host, inside in OPENSSL:
        workload[inside] = ImageFile(_required(Path(host), "install Debian's openssl "
                                               "(`make sysdeps`)"), 0o755)
    for program in (*CUDA_PROGRAMS, *NVML_PROGRAMS):
        workload[f"usr/local/bin/{program}"] = ImageFile((work / program).read_bytes(), 0o755)
    workload["usr/bin/nvidia-smi"] = ImageFile((work / "nvidia-smi").read_bytes(), 0o755)
    workload["etc/passwd"] = ImageFile(b"root:x:0:0:root:/:/bin/sh\n"
                                       b"nobody:x:65534:65534:nobody:/:/bin/false\n")
    workload["etc/group"] = ImageFile(b"root:x:0:\nnogroup:x:65534:\n")
    workload["tmp"] = ImageFile(mode=0o1777)
    return {
        PAUSE: (pause, {"Entrypoint": ["/pause"], "User": "65535:65535"}),
        WORKLOAD: (workload, {
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin",
                    f"LD_LIBRARY_PATH={DRIVER_LIBRARY_DIR}"],
            "Cmd": ["/bin/sh"],
        }),
    }


def ensure_images(layout: Layout, sim_lib: Path) -> dict[str, Image]:
    """Build both images (or reuse the cached tarballs of identical inputs); by reference."""
    images: dict[str, Image] = {}
    with tempfile.TemporaryDirectory(prefix="tessera-images-") as scratch:
        for ref, (files, config) in image_contents(sim_lib, Path(scratch)).items():
            digest, archive = oci_archive(ref, files, config)
            name = ref.split("/", 1)[1].replace(":", "-")
            path = layout.images / f"{name}-{digest[7:19]}.tar"
            if not path.exists():
                layout.images.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".partial")
                partial.write_bytes(archive)
                partial.rename(path)
            images[ref] = Image(ref=ref, digest=digest, archive=path)
    # Other images go once unused for an hour: a test bed of another checkout (other image
    # inputs) may be between building its tarball and importing it right now.
    for stale in layout.images.glob("*.tar"):
        if stale not in {image.archive for image in images.values()}:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - stale.stat().st_mtime > STALE_AFTER_S:
                    stale.unlink()
    return images


def import_images(
    prefix: Sequence[str], ctr: Path, address: str, images: Mapping[str, Image]
) -> None:
    """Load the tarballs into a containerd's k8s.io namespace (where the CRI plugin looks);
    `prefix` runs ctr where the socket is (e.g. nsenter into a node)."""
    for image in images.values():
        result = subprocess.run(
            [*prefix, str(ctr), "--address", address, "-n", "k8s.io", "images", "import",
             str(image.archive)],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise ControlPlaneError(
                f"importing {image.ref} into {address} failed: {result.stderr.strip()[:300]}"
            )
