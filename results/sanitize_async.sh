#!/usr/bin/env bash
# compute-sanitizer over the layout / cp.async / double-buffer kernels, on odd shapes
# (edge tiles, zero-filled copies, K not a multiple of BK, several k-tiles so the
# double buffers swap).  On a GPU machine, from the repository root:
#   bash results/sanitize_async.sh       (logs in $OUT, default ./sanitize-logs)
# sanitize_async-h200.log beside this script is its console output on an H200; for every
# kernel and all four tools use scripts/sanitize.py.
# Tools: racecheck (shared-memory hazards: a missing barrier or wait), synccheck
# (barriers in divergent code), memcheck (out-of-bounds / misaligned accesses).
# Exits non-zero if any tool reports an error or the kernels are wrong.
set -uo pipefail
cd "$(dirname "$0")/.."   # the repository root
export NUMBA_ENABLE_CUDASIM=0 CUPY_TF32=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/sanitize-logs}
mkdir -p "$OUT"
PY=${PY:-python3}

RUNPY=$(mktemp -d)/sanitize_run.py
cat > "$RUNPY" <<'EOF'
import gemmlib
from gemmlib.kernels import async_copy, double_buffer, layout_nt

specs = [layout_nt.SPEC, async_copy.SPEC, double_buffer.SPEC, double_buffer.build(unroll=False),
         async_copy.build(copy="sync"), double_buffer.build(copy="sync")]
shapes = [(129, 257, 19), (1, 1, 1), (130, 3, 45), (3, 131, 0)]
for s in specs:
    print(gemmlib.verify(s, shapes, seed=7), flush=True)
print("VERIFY OK")
EOF

TOOLS=${TOOLS:-"racecheck synccheck memcheck"}
# The tools run side by side (each is a separate process; most of the time is compiling).
for tool in $TOOLS; do
  extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  echo "=== compute-sanitizer --tool $tool ($(date -u +%H:%M:%S))"
  compute-sanitizer --tool "$tool" "${extra[@]}" --report-api-errors no --error-exitcode 99 \
    "$PY" "$RUNPY" >"$OUT/sanitize_${tool}.log" 2>&1 &
  eval "pid_$tool=$!"
done
status=0
for tool in $TOOLS; do
  log="$OUT/sanitize_${tool}.log"
  pidvar="pid_$tool"
  wait "${!pidvar}"
  rc=$?
  echo "=== $tool finished ($(date -u +%H:%M:%S)), exit $rc"
  tail -n 4 "$log"
  # Belt and braces: the summary line must say 0, and the kernels must have verified.
  if [ $rc -ne 0 ] || ! grep -q "VERIFY OK" "$log" \
     || grep -Eq "ERROR SUMMARY: [1-9]|SUMMARY: .*\\([1-9][0-9]* errors" "$log"; then
    echo "!!! $tool: FAILED (exit $rc), see $log"
    status=1
  else
    echo "--- $tool: clean (no errors)"
    grep -E "SUMMARY: .*[1-9][0-9]* warnings" "$log" && echo "    (warnings above: read $log)"
  fi
done
exit $status
