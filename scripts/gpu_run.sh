#!/usr/bin/env bash
# The GPU run: on a machine with an NVIDIA GPU, from the repository root.
#   test       the GPU-marked tests (large/random/property shapes, inputs, streams,
#              special values, big problems, intrinsic twins)
#   verify     every kernel on odd and large shapes
#   bench      the sweep against cuBLAS -> results/bench-<gpu>-<date>.{json,csv}
#   plot       figures/ regenerated from every results/bench-*.json
#   notebooks  every chapter executed in place (stored outputs name this GPU)
#   sanitize   compute-sanitizer memcheck/racecheck/synccheck/initcheck on every kernel
#   tune       split-K tuning (tile x slice count) of the classes TUNE_SHAPES fall in,
#              merged into gemmlib/data/tuning/<gpu>.json
#   hostcost   where one call's host time goes, and the first call in a fresh process
#              -> results/host-cost-<gpu>-<date>.json
#   benchcall  the public call gemmlib.matmul(A, B, out=C) timed as users call it, beside
#              kernel timing, for auto/warptile/split_k -> results/bench-<gpu>-<date>-call.*
# Every step runs even if an earlier one fails; the exit status says whether all passed.
# Logs go to $OUT (default ./gpu-run-logs); with PACK=1 results, figures and notebooks
# are also packed into $OUT/run.tar.gz (for machines whose files must be fetched back).
# Environment: STEPS (subset, in order), BENCH_ARGS, TUNE_SHAPES, SANITIZE_ARGS, NOTEBOOKS, PY.
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
    plot)      $PY -m gemmcourse plot "results/bench-*.json" --out figures 2>&1 | tee "$OUT/plot.log" ;;
    notebooks) PY=$PY bash scripts/execute_notebooks.sh ${NOTEBOOKS:-} 2>&1 | tee "$OUT/notebooks.log" ;;
    sanitize)  $PY scripts/sanitize.py ${SANITIZE_ARGS:-} 2>&1 | tee "$OUT/sanitize.log" ;;
    tune)      slug=$($PY -c "from gemmlib.tuning import gpu_slug; print(gpu_slug())")
               $PY scripts/tune.py --candidates split --splits 1 2 3 4 6 8 \
                 --shapes ${TUNE_SHAPES:-512 1024 2048 1024x1024x8192 777x1999x3001} \
                 --out "gemmlib/data/tuning/$slug.json" --log "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log" ;;
    hostcost)  $PY -m gemmlib bench --host-cost --out results 2>&1 | tee "$OUT/hostcost.log" ;;
    benchcall) $PY -m gemmlib bench --timing both --kernels auto warptile split_k --out results \
                 --quiet ${BENCH_ARGS:-} 2>&1 | tee "$OUT/benchcall.log" ;;
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
