"""``python -m gemmcourse plot results/bench-*.json --out figures``: the course's figures.

The library's own command line (``python -m gemmlib``) lists, verifies and
benchmarks kernels; drawing the book's figures from committed result files is
the course's job and lives here.
"""

from __future__ import annotations

import argparse
import glob
import sys


def cmd_plot(args) -> int:
    from gemmcourse.plot import plot_files

    paths = sorted({p for pat in args.results for p in glob.glob(pat)})
    if not paths:
        print(f"no result files match {args.results}", file=sys.stderr)
        return 1
    for p in plot_files(paths, args.out):
        print(f"wrote {p}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gemmcourse",
                                description="The course's helpers: figures from result files.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("plot", help="figures from result files")
    s.add_argument("results", nargs="+", help="result JSON files (globs allowed)")
    s.add_argument("--out", default="figures", help="output directory (default figures)")
    s.set_defaults(func=cmd_plot)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
