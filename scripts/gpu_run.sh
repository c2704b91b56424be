#!/usr/bin/env bash
# The GPU run: on a machine with an NVIDIA GPU, from the repository root.
#   1. every test, on the real GPU (GPU-marked ones included)
#   2. every kernel verified on odd and large shapes
#   3. the benchmark sweep against cuBLAS -> results/  (JSON + CSV)
#   4. figures regenerated from results/ -> figures/
# Logs go to $OUT (default ./gpu-run-logs). Stops at the first failure.
# Options via environment: STEPS="test verify bench plot" (subset), BENCH_ARGS.
set -euo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 CUPY_TF32=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/gpu-run-logs}
mkdir -p "$OUT" results figures
STEPS=${STEPS:-"test verify bench plot"}
PY=${PY:-python3}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv | tee "$OUT/gpu.txt"
$PY -c "import numba_cuda, numba, numpy, cupy; print('numba-cuda', numba_cuda.__version__, \
'numba', numba.__version__, 'numpy', numpy.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"

for step in $STEPS; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  case $step in
    test)   $PY -m pytest tests -q -p no:cacheprovider -x 2>&1 | tee "$OUT/test.log" ;;
    verify) $PY -m gemmlib verify 2>&1 | tee "$OUT/verify.log" ;;
    bench)  $PY -m gemmlib bench --out results --quiet ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
    plot)   $PY -m gemmlib plot "results/bench-*.json" --out figures 2>&1 | tee "$OUT/plot.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
