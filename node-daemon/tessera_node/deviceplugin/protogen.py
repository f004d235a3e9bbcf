"""Generate the Python modules of ``proto/*.proto`` with grpcio-tools (``make protos``).

The generated modules are committed, so a clean clone imports them without running protoc,
and ``tests/deviceplugin/test_protogen.py`` regenerates them into a temporary directory and
fails when the committed ones differ (a .proto edited without ``make protos``). grpcio-tools
is pinned in pyproject.toml, so the output is the same on every machine.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent / "proto"
ROOT = PROTO_DIR.parents[2]  # node-daemon/: the import root the modules are generated for
PROTOS = ("api.proto", "podresources.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names() -> list[str]:
    return [p.removesuffix(".proto") + s for p in PROTOS for s in SUFFIXES]


def generate(out: Path) -> list[Path]:
    """Write the generated modules into ``out`` (a directory); returns their paths."""
    from grpc_tools import protoc  # the generator: a dev dependency, not needed at run time

    with tempfile.TemporaryDirectory() as tmp:
        rel = PROTO_DIR.relative_to(ROOT)
        args = [
            "protoc",
            f"-I{ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            *(str(rel / p) for p in PROTOS),
        ]
        # protoc resolves -I against the working directory: give it absolute proto paths
        args[-len(PROTOS):] = [str(ROOT / rel / p) for p in PROTOS]
        rc = protoc.main(args)
        if rc != 0:
            raise RuntimeError(f"protoc failed ({rc}): {' '.join(args)}")
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for name in generated_names():
            dst = out / name
            shutil.copyfile(Path(tmp) / rel / name, dst)
            paths.append(dst)
        return paths


def main() -> int:
    for path in generate(PROTO_DIR):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
