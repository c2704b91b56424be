#!/usr/bin/env python3
"""Execute the book's notebooks in place, so their stored outputs come from this machine.

    python scripts/execute_notebooks.py                    # every chapters/*.ipynb
    python scripts/execute_notebooks.py chapters/03-naive.ipynb
    NUMBA_ENABLE_CUDASIM=1 python scripts/execute_notebooks.py   # simulator (tiny sizes)

Run it on the GPU machine before building the book: the first cell of every notebook
prints the GPU (name, compute capability, SMs, clock) and the software versions, so each
page records where its numbers come from.  Each notebook runs in a fresh kernel started in
the notebook's own folder.  A notebook that fails is reported and left unchanged; the exit
status is the number of failures.

Uses nbclient when it is installed, otherwise a minimal executor on jupyter_client (which
ipykernel and nbval already bring), so it also works on a bare GPU image.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def _execute_nbclient(nb, cwd: Path, timeout: int, kernel: str):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                   resources={"metadata": {"path": str(cwd)}}).execute()


def _execute_minimal(nb, cwd: Path, timeout: int, kernel: str):
    """Run every code cell in order in one kernel, storing outputs like nbclient does."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name=kernel, cwd=str(cwd))
    try:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            msg_id = kc.execute(cell.source, store_history=True)
            outputs, error = [], None
            while True:
                msg = kc.get_iopub_msg(timeout=timeout)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content["execution_state"] == "idle":
                    break
                if kind == "clear_output":
                    outputs = []
                elif kind == "stream" and outputs and outputs[-1].get("output_type") == "stream" \
                        and outputs[-1]["name"] == content["name"]:
                    outputs[-1]["text"] += content["text"]
                elif kind in ("stream", "display_data", "execute_result", "error"):
                    outputs.append(nbformat.v4.output_from_msg(msg))
                    if kind == "error":
                        error = content
            reply = kc.get_shell_msg(timeout=timeout)
            cell.outputs = outputs
            cell.execution_count = reply["content"].get("execution_count")
            if error is not None:
                raise RuntimeError(f"cell failed: {error['ename']}: {error['evalue']}\n"
                                   + cell.source[:300])
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(path: Path, timeout: int, kernel: str) -> float:
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    try:
        import nbclient  # noqa: F401

        _execute_nbclient(nb, path.parent, timeout, kernel)
    except ImportError:
        _execute_minimal(nb, path.parent, timeout, kernel)
    elapsed = time.perf_counter() - t0
    nbformat.write(nb, path)
    return elapsed


def first_output(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                return out["text"].strip().splitlines()[0]
    return "(no output)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="default: chapters/*.ipynb")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per cell (default 1800)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel name (default python3)")
    args = p.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "chapters").glob("*.ipynb"))
    mode = ("SIMULATOR" if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
            else "GPU (NUMBA_ENABLE_CUDASIM unset or 0)")
    print(f"executing {len(paths)} notebook(s) in place; mode: {mode}", flush=True)
    failures = 0
    for path in paths:
        print(f"=== {path}", flush=True)
        try:
            seconds = execute(path, args.timeout, args.kernel)
        except Exception as e:  # keep going: report every notebook
            failures += 1
            print(f"    FAILED (left unchanged): {type(e).__name__}: {e}", flush=True)
            continue
        print(f"    ok in {seconds:.1f} s | {first_output(path)}", flush=True)
    print(f"done: {len(paths) - failures} ok, {failures} failed")
    return failures


if __name__ == "__main__":
    sys.exit(main())
