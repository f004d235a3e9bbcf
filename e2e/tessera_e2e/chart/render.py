"""Render the permission templates of charts/tessera without Helm (RBAC, admission
policies, network policy: what the test bed's operator, run on the host, runs with), with the
few template actions they use.

``{{ .Release.Namespace }}``, ``{{ .Values.a.b }}``, ``{{ if .Values.x }}`` ...
[``{{ else }}`` ...] ``{{ end }}``, ``{{ range .Values.list }}`` ... ``{{ . }}`` ...
``{{ end }}``, with Go templates' ``{{-``/``-}}`` whitespace trimming.  Anything else is an
error, so a template using more of Helm fails here loudly instead of being applied
half-rendered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from tessera_e2e.paths import REPO

CHART = REPO / "charts" / "tessera"
# Rendered here; the other templates (Deployment, DaemonSet, webhooks, hooks) need Helm
# (tessera_e2e.chart.helm) and are installed by `helm install` in the chart tests.
PERMISSION_TEMPLATES = ("budget-protection.yaml", "networkpolicy.yaml", "node-daemon-rbac.yaml",
                        "node-restriction.yaml", "rbac.yaml", "scheduler-rbac.yaml")
_ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.DOTALL)


class TemplateError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    """('text', literal) and ('action', body), with the trim markers applied."""
    out: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(text):
        literal = text[pos:m.start()]
        if trim_next:
            literal = literal.lstrip()
        if m.group(1):
            literal = literal.rstrip()
        out.append(("text", literal))
        out.append(("action", m.group(2)))
        pos, trim_next = m.end(), bool(m.group(3))
    tail = text[pos:]
    out.append(("text", tail.lstrip() if trim_next else tail))
    return out


def _lookup(expr: str, scope: Mapping[str, Any], dot: Any) -> Any:
    if expr == ".":
        return dot
    if not expr.startswith("."):
        raise TemplateError(f"unsupported template expression {expr!r}")
    value: Any = scope
    for part in expr[1:].split("."):
        if not isinstance(value, Mapping) or part not in value:
            raise TemplateError(f"{expr} is not set")
        value = value[part]
    return value


def _render(tokens: list[tuple[str, str]], i: int, scope: Mapping[str, Any], dot: Any,
            out: list[str] | None) -> tuple[int, str]:
    """Render from token ``i`` to its ``end`` or ``else`` (or the end); returns the index
    after it and which one it was. ``out`` None: skip (a false branch), still parsing to
    find the matching ``end``."""
    while i < len(tokens):
        kind, body = tokens[i]
        i += 1
        if kind == "text":
            if out is not None:
                out.append(body)
        elif body in ("end", "else"):
            return i, body
        elif body.startswith("if "):
            taken = out is not None and bool(_lookup(body[3:].strip(), scope, dot))
            i, stop = _render(tokens, i, scope, dot, out if taken else None)
            if stop == "else":
                i, stop = _render(tokens, i, scope, dot,
                                  out if out is not None and not taken else None)
        elif body.startswith("range "):
            items = _lookup(body[6:].strip(), scope, dot) if out is not None else []
            start = i
            i, _ = _render(tokens, start, scope, dot, None)
            for item in items or []:
                _render(tokens, start, scope, item, out)
        else:
            if out is not None:
                out.append(str(_lookup(body, scope, dot)))
    return i, ""


def render_template(text: str, scope: Mapping[str, Any]) -> str:
    out: list[str] = []
    _render(_tokens(text), 0, scope, None, out)
    return "".join(out)


def merge(base: Any, over: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
    return over


def render(namespace: str, values: Mapping[str, Any] | None = None) -> str:
    """The permission templates with the chart's values (``values`` merged over them), as
    one multi-document YAML; templates that render to nothing are left out."""
    merged = merge(yaml.safe_load((CHART / "values.yaml").read_text()), values or {})
    scope = {"Release": {"Namespace": namespace}, "Values": merged}
    docs = [render_template(t.read_text(), scope)
            for t in (CHART / "templates" / name for name in PERMISSION_TEMPLATES)]
    return "\n---\n".join(d for d in docs if d.strip())
