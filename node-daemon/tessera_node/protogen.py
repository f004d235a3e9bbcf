"""Generate the Python modules of the daemon's ``.proto`` files with grpcio-tools
(``make protos``): the device plugin's (``deviceplugin/proto/``) and the DRA kubelet plugin's
(``dra/proto/``).

The generated modules are committed, so a clean clone imports them without running protoc,
and the protogen tests regenerate them into a temporary directory and fail when the committed
ones differ (a .proto edited without ``make protos``). grpcio-tools is pinned in
pyproject.toml, so the output is the same on every machine.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parent  # node-daemon/: the import root the modules are generated for
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


@dataclass(frozen=True)
class Protos:
    """One folder of .proto files and the modules generated beside them."""

    dir: Path
    protos: tuple[str, ...]

    def generated_names(self) -> list[str]:
        return [p.removesuffix(".proto") + s for p in self.protos for s in SUFFIXES]

    def generate(self, out: Path) -> list[Path]:
        """Write the generated modules into ``out`` (a directory); returns their paths."""
        from grpc_tools import protoc  # the generator: a dev dependency, not needed at run time

        with tempfile.TemporaryDirectory() as tmp:
            rel = self.dir.relative_to(ROOT)
            # protoc resolves -I against the working directory: absolute proto paths
            args = ["protoc", f"-I{ROOT}", f"--python_out={tmp}", f"--pyi_out={tmp}",
                    f"--grpc_python_out={tmp}", *(str(self.dir / p) for p in self.protos)]
            rc = protoc.main(args)
            if rc != 0:
                raise RuntimeError(f"protoc failed ({rc}): {' '.join(args)}")
            out.mkdir(parents=True, exist_ok=True)
            paths = []
            for name in self.generated_names():
                dst = out / name
                shutil.copyfile(Path(tmp) / rel / name, dst)
                paths.append(dst)
            return paths


DEVICE_PLUGIN = Protos(PACKAGE / "deviceplugin" / "proto", ("api.proto", "podresources.proto"))
DRA = Protos(PACKAGE / "dra" / "proto", ("pluginregistration.proto", "dra_v1.proto"))
ALL = (DEVICE_PLUGIN, DRA)


def main() -> int:
    for protos in ALL:
        for path in protos.generate(protos.dir):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
