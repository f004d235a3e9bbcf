"""The package structure holds: what two processes share lives in a neutral package, and no
package imports its siblings in a circle (read from the source, so a new import that breaks
the layering fails here, not in a review)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"tessera": ROOT / "core" / "tessera",
            "tessera_operator": ROOT / "operator" / "tessera_operator",
            "tessera_node": ROOT / "node-daemon" / "tessera_node"}
PROCESSES = ("tessera_operator", "tessera_node")


def _modules() -> Iterator[tuple[str, Path]]:
    for top, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([top, *parts]), path


def _imports(module: str, path: Path) -> set[str]:
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
    return {i for i in out if i.split(".")[0] in PACKAGES}


def _unit(module: str) -> str:
    """The sibling package a module belongs to: ``tessera_operator.webhooks.admission`` ->
    ``tessera_operator.webhooks``; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


GRAPH = {m: _imports(m, p) for m, p in _modules()}
KNOWN = set(GRAPH)


def _edges() -> dict[str, set[str]]:
    units: dict[str, set[str]] = {}
    for mod, imports in GRAPH.items():
        for imp in imports:
            target = imp if imp in KNOWN else imp.rsplit(".", 1)[0]
            if target not in KNOWN or _unit(target) == _unit(mod):
                continue
            units.setdefault(_unit(mod), set()).add(_unit(target))
    return units


def test_no_package_imports_its_siblings_in_a_circle() -> None:
    edges = _edges()
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if seen.get(nxt) == 1:
                cycle = [*trail[trail.index(nxt):], nxt] if nxt in trail else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in seen:
                visit(nxt, [*trail, nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [start])


def test_only_the_cli_imports_the_operator_process() -> None:
    offenders = sorted(f"{m} imports {i}" for m, imports in GRAPH.items() for i in imports
                       if i.startswith("tessera_operator.controller")
                       and not m.startswith(("tessera_operator.controller",
                                             "tessera_operator.cli")))
    assert offenders == []


def test_webhooks_stand_apart_from_the_controller() -> None:
    edges = _edges()
    assert "tessera_operator.controller" not in edges.get("tessera_operator.webhooks", set())
    assert "tessera_operator.controller" not in edges.get("tessera_operator.cache", set())


def test_the_core_imports_no_process_and_no_process_imports_the_other() -> None:
    """``tessera`` (core/) is what both processes share; the operator and the node daemon
    each import it and nothing of each other's (the node image ships no operator code)."""
    offenders = []
    for mod, imports in GRAPH.items():
        top = mod.split(".")[0]
        for imp in imports:
            other = imp.split(".")[0]
            if other in PROCESSES and other != top:
                offenders.append(f"{mod} imports {imp}")
    assert offenders == []


def test_rules_do_no_io() -> None:
    """The pure packages (rules) never reach for the client layer or a process."""
    io = ("tessera.kube", "tessera_operator.cache", "tessera_operator.controller",
          "tessera_operator.webhooks", "aiohttp", "kubernetes", "kopf")
    for mod, path in _modules():
        if _unit(mod) in ("tessera_operator.quota", "tessera.mig", "tessera.partition",
                          "tessera.api"):
            tree = ast.parse(path.read_text())
            names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            assert not {n for n in names if n.startswith(io)}, mod


def _string_constants(path: Path) -> Iterator[tuple[int, str]]:
    """Every string literal that is not a docstring."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    docstrings.add(id(stmt.value))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            yield node.lineno, node.value


def test_wire_names_are_spelled_once() -> None:
    """``tessera.dev`` appears in code only in :mod:`tessera.api.names` (and in the two
    ``Literal`` types pydantic needs the value itself for)."""
    allowed = {"tessera.api.names"}
    found = []
    for mod, path in _modules():
        if mod in allowed:
            continue
        for line, value in _string_constants(path):
            if "tessera.dev" in value and value != "tessera.dev/v1alpha1":
                found.append(f"{mod}:{line}: {value!r}")
    assert found == []


DISTRIBUTIONS = {"tessera": ROOT / "core", "tessera_operator": ROOT / "operator",
                 "tessera_node": ROOT / "node-daemon"}
MODULE_OF = {"PyYAML": "yaml", "nvidia-ml-py": "pynvml", "grpcio": "grpc",
             "protobuf": "google", "prometheus-client": "prometheus_client",
             "tessera-core": "tessera"}
"""Distribution name -> the top-level module it installs (where the two differ)."""


def _declared(project: Path) -> set[str]:
    import re
    import tomllib

    deps = tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0] for d in deps}
    return {MODULE_OF.get(n, n.replace("-", "_").lower()) for n in names}


def test_each_distribution_declares_what_its_code_imports_and_no_more() -> None:
    """The three wheels (core/, operator/, node-daemon/: each image installs its process's
    two) carry exactly the dependencies their code imports: the node image has no kopf or
    cryptography, the operator image no grpc or pynvml."""
    import sys

    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    for top, project in DISTRIBUTIONS.items():
        imported: set[str] = set()
        for mod, path in _modules():
            if mod.split(".")[0] != top:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    imported.add(node.module.split(".")[0])
        third_party = imported - stdlib - {top, "pydantic_core", "grpc_tools"}
        assert third_party == _declared(project), (top, third_party, _declared(project))


def test_the_three_distributions_and_the_chart_carry_one_version() -> None:
    import tomllib

    import tessera
    import tessera_node
    import tessera_operator

    chart = (ROOT / "charts" / "tessera" / "Chart.yaml").read_text()
    app = next(line.split(":", 1)[1].strip().strip('"') for line in chart.splitlines()
               if line.startswith("appVersion:"))
    versions = {tomllib.loads((p / "pyproject.toml").read_text())["project"]["version"]
                for p in DISTRIBUTIONS.values()}
    versions |= {tessera.__version__, tessera_operator.__version__,
                 getattr(tessera_node, "__version__", app)}
    assert versions == {app}
    for p in (ROOT / "operator", ROOT / "node-daemon"):
        deps = tomllib.loads((p / "pyproject.toml").read_text())["project"]["dependencies"]
        assert f"tessera-core=={app}" in deps, p
