#!/usr/bin/env python3
"""Re-execute chosen cells of a notebook, keeping every other cell's stored output.

    NUMBA_ENABLE_CUDASIM=1 python scripts/execute_cells.py chapters/13-library-call.ipynb 7

For a page whose stored outputs come from a GPU, when one cell's output must follow the code
(a source listing, a call's printed result, a figure drawn from committed data) and the
machine at hand has no GPU: the named cells run in a fresh kernel, after the set-up cell (the
first code cell) and the cells ``--after`` names, whose outputs are left as they were.
``--before CODE`` runs CODE after those, unrecorded (e.g. a ``dev`` describing the GPU the
page ran on, for a cell that draws from it).

Only the executed cells' outputs (and execution counts) change in the file; the rest of its
JSON, key order included, is written back as it was read.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("cells", nargs="+", type=int, help="indices of the cells to re-execute")
    p.add_argument("--after", nargs="*", type=int, default=[],
                   help="cells run first, their outputs kept (e.g. imports)")
    p.add_argument("--before", default=None,
                   help="code run after --after and before the cells, not recorded")
    args = p.parse_args(argv)
    raw = json.loads(args.notebook.read_text())
    nb = nbformat.reads(json.dumps(raw), as_version=4)
    client = NotebookClient(nb, timeout=600, resources={"metadata": {"path": str(
        args.notebook.parent)}})
    setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    with client.setup_kernel():
        for i in [setup] + args.after:
            kept = nb.cells[i].get("outputs")
            client.execute_cell(nb.cells[i], i)
            nb.cells[i]["outputs"] = kept
        if args.before:   # a cell of its own, dropped once run
            nb.cells.append(nbformat.v4.new_code_cell(args.before))
            client.execute_cell(nb.cells[-1], len(nb.cells) - 1)
            nb.cells.pop()
        for i in args.cells:
            client.execute_cell(nb.cells[i], i)
    for i in args.cells:
        done = json.loads(nbformat.writes(nbformat.from_dict(
            {**nb, "cells": [nb.cells[i]]})))["cells"][0]
        raw["cells"][i]["outputs"] = done["outputs"]
        raw["cells"][i]["execution_count"] = done["execution_count"]
    args.notebook.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n")
    print(f"{args.notebook}: re-executed cells {args.cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
