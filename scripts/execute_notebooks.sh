#!/usr/bin/env bash
# Execute every chapter notebook in place (stored outputs for the book), then build the book.
#   On the GPU machine:   bash scripts/execute_notebooks.sh
#   In the simulator:     NUMBA_ENABLE_CUDASIM=1 bash scripts/execute_notebooks.sh
# Arguments, if any, are notebook paths (default: chapters/*.ipynb).
# PY selects the interpreter (default .venv/bin/python if present, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${PY:-}" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
# A Jupyter kernel named python3 that runs this interpreter (idempotent).
"$PY" -m ipykernel install --sys-prefix --name python3 >/dev/null
"$PY" scripts/execute_notebooks.py "$@"
JB="$(dirname "$PY")/jupyter-book"
if [[ -x "$JB" ]]; then
  "$JB" build . -W
else
  echo "jupyter-book not installed next to $PY: skipping the book build"
fi
