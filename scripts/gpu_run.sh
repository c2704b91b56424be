#!/usr/bin/env bash
# The GPU run: on a machine with an NVIDIA GPU, from the repository root.
#   test       the GPU-marked tests (large/random/property shapes, inputs, streams,
#              special values, big problems, intrinsic twins)
#   verify     every kernel on odd and large shapes
#   bench      the sweep against cuBLAS -> results/bench-<gpu>-<date>.{json,csv}
#   plot       figures/ regenerated from every results/bench-*.json
#   notebooks  every chapter executed in place (stored outputs name this GPU)
#   sanitize   compute-sanitizer memcheck/racecheck/synccheck/initcheck on every kernel
# Every step runs even if an earlier one fails; the exit status says whether all passed.
# Logs go to $OUT (default ./gpu-run-logs); with PACK=1 results, figures and notebooks
# are also packed into $OUT/run.tar.gz (for machines whose files must be fetched back).
# Environment: STEPS (subset, in order), BENCH_ARGS, PY.
set -uo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 CUPY_TF32=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-$PWD/gpu-run-logs}
mkdir -p "$OUT" results figures
STEPS=${STEPS:-"test verify bench plot notebooks sanitize"}
PY=${PY:-python3}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv | tee "$OUT/gpu.txt"
$PY -c "import numba_cuda, numba, numpy, cupy; print('numba-cuda', numba_cuda.__version__, \
'numba', numba.__version__, 'numpy', numpy.__version__, 'cupy', cupy.__version__)" | tee -a "$OUT/gpu.txt"

declare -A status
for step in $STEPS; do
  echo "=== $step ($(date -u +%H:%M:%S))"
  t0=$SECONDS
  case $step in
    test)      $PY -m pytest tests -m gpu -q -p no:cacheprovider -W ignore::DeprecationWarning \
                 2>&1 | tee "$OUT/test.log" ;;
    verify)    $PY -m gemmlib verify 2>&1 | tee "$OUT/verify.log" ;;
    bench)     $PY -m gemmlib bench --out results --quiet ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" ;;
    plot)      $PY -m gemmlib plot "results/bench-*.json" --out figures 2>&1 | tee "$OUT/plot.log" ;;
    notebooks) PY=$PY bash scripts/execute_notebooks.sh 2>&1 | tee "$OUT/notebooks.log" ;;
    sanitize)  $PY scripts/sanitize.py 2>&1 | tee "$OUT/sanitize.log" ;;
    *) echo "unknown step $step"; false ;;
  esac
  status[$step]=$?
  echo "=== $step: exit ${status[$step]} after $((SECONDS - t0)) s"
done

if [[ ${PACK:-0} == 1 ]]; then
  tar czf "$OUT/run.tar.gz" results figures chapters/*.ipynb 2>/dev/null
fi
fail=0
echo "=== summary"
for step in $STEPS; do
  echo "  $step: ${status[$step]}"
  [[ ${status[$step]} == 0 ]] || fail=1
done
exit $fail
