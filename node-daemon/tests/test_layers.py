"""The node daemon's folders are layers: a folder imports only folders of lower layers, never
one above it (read from the source, so an import that breaks the layering fails here), and
its pure rules import nothing that does I/O. The layering between processes and the core
package is ``operator/tests/test_import_graph.py``'s."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

BASE = Path(__file__).resolve().parents[1] / "tessera_node"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"device", "budget", "settings", "protogen"}),  # the host and the GPUs;
    #                                     files; settings; the gRPC modules' generator
    frozenset({"container"}),  # what a container tessera set up gets (either path)
    frozenset({"metrics"}),  # the daemon's Prometheus series
    frozenset({"layout"}),  # MIG layouts: desired, plan, commands, enact, queue
    frozenset({"deviceplugin"}),  # the kubelet device plugin (and its containers' registry)
    frozenset({"cores", "audit"}),  # what runs over the containers the device plugin set up
    frozenset({"node"}),  # what the Node says, and the reconciler that writes it
    frozenset({"dra"}),  # DRA: the node's ResourceSlices (from what the Node's pass found)
    #                        and the DRA kubelet plugin
    frozenset({"app"}),  # the process: wiring
    frozenset({"cli"}),  # the command line
)
"""Lowest first. A folder (or top-level module) of the package is in exactly one layer."""

PURE = frozenset({
    "device.state", "device.cgroups",
    "layout.desired", "layout.plan", "layout.commands", "layout.holders", "layout.on_demand",
    "cores.fairshare", "cores.ratelaw", "cores.tokenlaw",
    "deviceplugin.devices", "deviceplugin.allocation", "deviceplugin.matcher",
    "deviceplugin.fit", "deviceplugin.budgets", "deviceplugin.resize", "deviceplugin.pacing",
    "container.response", "deviceplugin.placed", "deviceplugin.pending",
    "container.device_files", "container.entries",
    "dra.claims", "dra.cdi",
    "audit.logic",
    "node.content", "node.reports", "node.findings", "node.inventory", "node.patch",
    "node.coexistence",
    "dra.decide",
})
"""The rules: decisions from values, property- or table-tested, no I/O."""
FORMATS = frozenset({"budget.formats"})
"""The budget file's byte layout (its entries are values the rules build)."""
IO_LIBRARIES = ("asyncio", "grpc", "pynvml", "aiohttp", "subprocess", "socket", "threading",
                "tessera.kube.client", "prometheus_client")


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(BASE.rglob("*.py")):
        rel = path.relative_to(BASE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if (parts and parts[-1].endswith("_pb2")) or "proto" in parts:
            continue  # generated gRPC modules
        yield ".".join(parts), path


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            if node.module == "tessera_node" or node.module.count(".") == 1:
                out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _own(name: str) -> str | None:
    """``tessera_node.layout.plan`` -> ``layout.plan``; None outside the package."""
    return name.removeprefix("tessera_node.") if name.startswith("tessera_node.") else None


def _layer(module: str) -> int:
    top = module.split(".")[0]
    return next(i for i, layer in enumerate(LAYERS) if top in layer)


def test_every_folder_has_a_layer() -> None:
    tops = {m.split(".")[0] for m, _ in _modules() if m}
    placed = set().union(*LAYERS)
    assert tops - placed == set(), "place these in LAYERS"
    assert placed - tops == set(), "gone from the package"


def test_no_folder_imports_one_above_it() -> None:
    upward = []
    for module, path in _modules():
        if not module:
            continue
        for imp in _imports(path):
            own = _own(imp)
            if own is None or own.split(".")[0] == module.split(".")[0]:
                continue
            if _layer(own) >= _layer(module):
                upward.append(f"{module} imports {own}")
    assert upward == []


def test_the_rules_do_no_io() -> None:
    known = {m for m, _ in _modules()}
    assert known >= PURE
    offenders = []
    for module, path in _modules():
        if module not in PURE:
            continue
        for imp in _imports(path):
            own = _own(imp)
            if own is not None and own in known and own not in PURE | FORMATS \
                    and not (BASE / own.replace(".", "/")).is_dir():  # a package: its docstring
                offenders.append(f"{module} imports {own}")
            if imp.startswith(IO_LIBRARIES):
                offenders.append(f"{module} imports {imp}")
    assert offenders == []
