#!/usr/bin/env bash
# The GPU run of the layouts work, on one GPU, from the repository root:
#   tests   the GPU tests of layouts, bias, stacks and the rungs with K-major builds
#   bench   python -m gemmlib bench --suite layouts -> results/layouts-<gpu>-<date>.json
# Logs and result files go to $OUT (default /tmp/layouts-out).  Environment: STEPS,
# T_TESTS, T_BENCH (seconds per step), TEST_FILES, LAYOUT_ARGS (for the bench).
set -uo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 CUPY_TF32=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GEMMLIB_CACHE=${GEMMLIB_CACHE:-/tmp/gcache}
OUT=${OUT:-/tmp/layouts-out}
mkdir -p "$OUT" results
STEPS=${STEPS:-"tests bench"}
TEST_FILES=${TEST_FILES:-"tests/test_layouts.py tests/test_wgmma_layouts.py tests/test_nk_rungs.py"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit \
  --format=csv,noheader | tee "$OUT/gpu.txt"
for step in $STEPS; do
  t0=$SECONDS
  case $step in
    tests) timeout "${T_TESTS:-300}" python3 -m pytest $TEST_FILES -m gpu -q -rfE \
             -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests.log" 2>&1
           echo "=== tests rc=$? after $((SECONDS - t0)) s"; tail -n 25 "$OUT/tests.log" ;;
    bench) timeout "${T_BENCH:-400}" python3 -m gemmlib bench --suite layouts --out "$OUT" \
             ${LAYOUT_ARGS:-} > "$OUT/bench.log" 2>&1
           echo "=== bench rc=$? after $((SECONDS - t0)) s"; tail -n 40 "$OUT/bench.log" ;;
  esac
done
