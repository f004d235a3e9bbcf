"""Run every benchmark in this folder, one after another, and print what each measured.

Each benchmark is a script that prints its own figures (ratios measured in the same run);
this runner only finds them, runs them with this interpreter and reports failures.
Usage: ``python bench/run.py [NAME ...]`` (names without ``.py``; default: all).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != "run.py")
    if argv:
        wanted = set(argv)
        unknown = wanted - {p.stem for p in scripts}
        if unknown:
            known = ", ".join(p.stem for p in scripts)
            print(f"bench: unknown benchmark(s) {', '.join(sorted(unknown))}; known: {known}",
                  file=sys.stderr)
            return 2
        scripts = [p for p in scripts if p.stem in wanted]
    failed = []
    for script in scripts:
        print(f"=== {script.stem}", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, str(script)], cwd=HERE.parent)
        elapsed = time.monotonic() - started
        print(f"=== {script.stem}: exit {rc} after {elapsed:.1f} s\n", flush=True)
        if rc != 0:
            failed.append(script.stem)
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
