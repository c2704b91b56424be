#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every registered
# kernel, on a machine with an NVIDIA GPU; from anywhere. Extra arguments go to
# scripts/sanitize.py (e.g. --kernels naive,shared --tools racecheck --jobs 4).
# Logs and sanitize.json go to $OUT/sanitize (default ./sanitize-logs).
set -euo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PY:-python3}" scripts/sanitize.py "$@"
