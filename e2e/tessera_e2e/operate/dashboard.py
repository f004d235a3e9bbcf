"""The Grafana dashboard's queries as Prometheus runs them (pure: no I/O).

Grafana sends each panel target's ``expr`` after expanding the dashboard's variables and its
own macros; a test that checks the queries against a real Prometheus must do the same:

- ``$var`` / ``${var}`` / ``[[var]]``: one value as it is, several (or "All" without an
  ``allValue``) as a regex alternation of the regex-escaped values, "All" with an
  ``allValue`` as that value (``.*``);
- ``$__rate_interval``: max(``$__interval`` + scrape interval, 4 x scrape interval), Grafana's
  definition; ``$__interval`` and ``$__range`` as given.

``PENDING`` names the metrics that dashboards and rules already use but no component exports
yet, with what is to export them: a query on one of them is expected to return nothing until
then (and a test fails once it returns series, so the list stays true).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PENDING: dict[str, str] = {}
"""Metric (histograms by their base name) -> what is to export it."""

_VARIABLE = re.compile(r"\$\{(\w+)\}|\[\[(\w+)\]\]|\$(\w+)")
_METRIC = re.compile(r"\btessera_[a-z0-9_]+")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_LABEL_VALUES = re.compile(
    r"^\s*label_values\(\s*(?:(?P<match>.+)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)\s*$")


@dataclass(frozen=True)
class Target:
    panel: str
    ref: str
    expr: str


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    """The label whose values the variable offers."""
    match: str | None
    """The series selector of ``label_values(match, label)`` (None: every series)."""
    all_value: str | None


def _panels(panels: Sequence[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels") or [])


def targets(dashboard: Mapping[str, Any]) -> list[Target]:
    """Every query target of every panel, rows' nested panels included."""
    out = []
    for p in _panels(dashboard.get("panels") or []):
        for t in p.get("targets") or []:
            out.append(Target(str(p.get("title", "")), str(t.get("refId", "")),
                              str(t.get("expr", ""))))
    return out


def variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    """The query variables (``label_values(...)``); a query of another form is an error."""
    out = []
    for v in (dashboard.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        text = str(q.get("query", "") if isinstance(q, Mapping) else q)
        m = _LABEL_VALUES.match(text)
        if m is None:
            raise ValueError(f"variable {v.get('name')}: {text!r} is not label_values(...)")
        out.append(Variable(str(v["name"]), m.group("label"), m.group("match"),
                            v.get("allValue") if v.get("includeAll") else None))
    return out


def rate_interval(interval_s: float, scrape_s: float) -> float:
    """Grafana's ``$__rate_interval``."""
    return max(interval_s + scrape_s, 4 * scrape_s)


_REGEX_SPECIAL = frozenset("\\.^$*+?()[]{}|")


def regex_escape(value: str) -> str:
    """``value`` as a literal inside a regex inside a PromQL string, as Grafana escapes it:
    each regex metacharacter gets a backslash, written as two (PromQL's string escaping); a
    backslash itself becomes four."""
    return "".join("\\\\" * 2 if c == "\\" else "\\\\" + c if c in _REGEX_SPECIAL else c
                   for c in value)


def regex_value(values: Sequence[str]) -> str:
    """The selected values of a multi-value variable, as Grafana formats them for a
    Prometheus ``=~`` matcher."""
    if len(values) == 1:
        return regex_escape(values[0])
    return "(" + "|".join(regex_escape(v) for v in values) + ")"


def duration(seconds: float) -> str:
    """A PromQL duration, in milliseconds (exact for any interval Grafana computes)."""
    return f"{round(seconds * 1000)}ms"


def expand(expr: str, values: Mapping[str, str], *, interval_s: float, scrape_s: float,
           range_s: float = 3600.0) -> str:
    """``expr`` as Grafana sends it: ``values`` maps each variable to its formatted value
    (see :func:`regex_value`); a variable it does not know is an error."""
    macros = {"__rate_interval": duration(rate_interval(interval_s, scrape_s)),
              "__interval": duration(interval_s), "__range": duration(range_s)}

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in macros:
            return macros[name]
        if name not in values:
            raise KeyError(f"{expr!r} uses ${name}, which the dashboard does not define")
        return values[name]

    return re.sub(_VARIABLE, sub, expr)


def uses(expr: str) -> set[str]:
    """Variables an expression refers to (Grafana's own ``__`` macros left out)."""
    found = {a or b or c for a, b, c in re.findall(_VARIABLE, expr)}
    return {n for n in found if not n.startswith("__")}


def metrics(expr: str) -> set[str]:
    """tessera metric names in ``expr``, histograms by their base name."""
    out = set()
    for name in _METRIC.findall(expr):
        for suffix in _HISTOGRAM_SUFFIXES:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        out.add(name)
    return out


def pending_in(expr: str) -> set[str]:
    return metrics(expr) & PENDING.keys()
