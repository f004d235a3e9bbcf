"""``python -m tessera_sim node --gpu H100-80GB --gpu A100-40GB:mig --out node.conf``
``python -m tessera_sim node --gpu H100-80GB --gpu H100-80GB --nvlink 0-1 --numa 0,1 --out …``
``python -m tessera_sim fault --fn cuMemAlloc_v2 --count 2 --code 2``"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

from tessera_sim import LIB_DIR
from tessera_sim.node import GPUSpec, Topology, write_node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera_sim")
    sub = parser.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node", help="write a node description")
    node.add_argument("--gpu", action="append", required=True, help="MODEL or MODEL:mig")
    node.add_argument("--out", required=True, type=Path)
    node.add_argument("--seed", default="tessera-sim", help="seed of the GPU UUIDs")
    node.add_argument("--ns-per-block", type=int, default=1000)
    node.add_argument("--context-mib", type=int, default=0)
    node.add_argument("--nvlink", default="",
                      help="NVLinks: 'all' or A-B[:LINKS],... (default: none)")
    node.add_argument("--numa", default="", help="NUMA node per GPU: 0,0,1,1 (default: all 0)")
    fault = sub.add_parser("fault", help="inject a fault into every process of the node")
    fault.add_argument("--fn", required=True, help="function name, e.g. nvmlInit_v2")
    fault.add_argument("--count", type=int, default=1, help="calls to affect, -1 for all")
    fault.add_argument("--code", type=int, default=0, help="error code to return, 0: none")
    fault.add_argument("--delay-us", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "node":
        try:
            specs = [GPUSpec.parse(g) for g in args.gpu]
            topology = Topology.parse(args.nvlink, args.numa, len(specs))
        except (KeyError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        write_node(
            args.out, specs, topology, seed=args.seed, default_ns_per_block=args.ns_per_block,
            context_mib=args.context_mib,
        )
        return 0
    lib = ctypes.CDLL(str(LIB_DIR / "libnvidia-ml.so.1"))
    rc = lib.tesseraSimSetFault(args.fn.encode(), args.count, args.code, args.delay_us)
    if rc != 0:
        print("error: cannot set the fault (is TESSERA_SIM_NODE set?)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
