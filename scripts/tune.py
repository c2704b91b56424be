"""Autotune a rung on this GPU and record the best configuration per shape class.

    python scripts/tune.py                              # warptile, 4096^3, default search
    python scripts/tune.py --shapes 4096 8192 4095x3073x2047 --limit 30 --register-caps
    python scripts/tune.py --candidates '[{"BM":128,"BN":128,"BK":16,...}]' --out FILE
    python scripts/tune.py --shapes 1024x1024x8192 --candidates split --splits 1 2 3 4 6 8

A shape is N (for N^3) or MxNxK.  Results merge into --out (default: the user
cache, ``$GEMMLIB_CACHE`` or ``~/.cache/gemmlib/tuning/<gpu>.json``); to
update the tables shipped in the package pass
``--out gemmlib/data/tuning/<gpu-slug>.json``.  Every candidate's fate (timed,
rejected with the reason, failed) is printed and, with --log, saved as JSON.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

from gemmlib import autotune  # noqa: E402


def shape(s: str):
    parts = [int(v) for v in s.lower().split("x")]
    return tuple(parts * 3 if len(parts) == 1 else parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel", default=autotune.DEFAULT_KERNEL)
    p.add_argument("--shapes", nargs="+", type=shape, default=[(4096, 4096, 4096)])
    p.add_argument("--limit", type=int, default=24, help="candidates to time per shape")
    p.add_argument("--register-caps", action="store_true",
                   help="also try each candidate with max_registers capped")
    p.add_argument("--candidates", help="JSON list of parameter dicts (instead of the search), "
                   "or 'split': autotune.SPLIT_TILES")
    p.add_argument("--budget", type=float, default=None, help="seconds per shape")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--log", type=Path, default=None, help="write every trial here (JSON)")
    p.add_argument("--splits", nargs="+", type=int, default=[1],
                   help="K slice counts to try with every candidate (1 = no split-K)")
    args = p.parse_args(argv)
    if args.candidates == "split":  # the tiles split-K tuning pairs with --splits
        cands = autotune.SPLIT_TILES[args.kernel]
    elif args.candidates:
        cands = json.loads(args.candidates)
    else:
        cands = autotune.default_candidates(args.kernel, limit=args.limit,
                                            register_caps=args.register_caps)
    logs = []
    for s in args.shapes:
        print(f"== {args.kernel} at {s[0]}x{s[1]}x{s[2]}: {len(cands)} candidates", flush=True)
        r = autotune.tune(s, args.kernel, cands, limit=len(cands) * len(args.splits),
                          time_budget_s=args.budget, path=args.out, splits=args.splits)
        print(r.table(), flush=True)
        logs.append(autotune.trials_json(r))
    if args.log:
        args.log.write_text(json.dumps(logs, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
