"""Draw the dashboard's main panels as one PNG from an end-to-end run's data.

    TESSERA_DASHBOARD_DATA=/tmp/dashboard-data.json \\
        .venv/bin/python -m pytest e2e/tests/system/test_operate.py
    .venv/bin/python deploy/grafana/render.py /tmp/dashboard-data.json docs/img/dashboard.png

The data file holds what the run's Prometheus answered to each panel's queries (range
queries over the run, every variable at "All"); nothing is made up here.  Needs matplotlib
(``pip install -e '.[picture]'``).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

UNITS = {"GPU memory used": ("GiB", 2**30), "GPU memory: budgeted vs hard": ("GiB", 2**30),
         "Share of hard in use": ("%", 0.01)}


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def draw(ax: Any, panel: dict[str, Any], start: float, legends: dict[str, str]) -> None:
    unit, scale = UNITS.get(panel["title"], ("", 1.0))
    for target in panel["targets"]:
        for s in target["series"]:
            xs = [float(t) - start for t, _ in s["values"]]
            ys = [float(v) / scale for _, v in s["values"]]
            ax.plot(xs, ys, linewidth=1.4, label=legend(legends.get(target["expr"], ""),
                                                        s["metric"])[:38])
    ax.set_title(panel["title"] + (f" ({unit})" if unit else ""), fontsize=10)
    ax.set_xlabel("seconds into the run", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=6, loc="upper left", ncol=2 if len(ax.lines) > 4 else 1)


def main(data_path: str, out_path: str, dashboard_path: str | None = None) -> None:
    data = json.loads(Path(data_path).read_text())
    dash = json.loads(Path(dashboard_path or Path(__file__).with_name(
        "tessera-dashboard.json")).read_text())
    legends = {t["expr"]: t.get("legendFormat", "") for p in dash["panels"]
               for t in p.get("targets") or []}
    panels = data["panels"]
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(13, 3.1 * rows))
    for ax, panel in zip(axes.flat, panels, strict=False):
        draw(ax, panel, data["start"], legends)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    when = dt.datetime.fromtimestamp(data["end"], dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    fig.suptitle(f"tessera dashboard, main panels: operator + 2 tessera-node daemons on "
                 f"simulated H100 nodes, end-to-end run of {when}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(out_path, dpi=90)


if __name__ == "__main__":
    main(*sys.argv[1:])
