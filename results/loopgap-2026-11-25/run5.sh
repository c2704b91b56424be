#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/run5.sh OUTDIR TAG
# wgmma_store registered: the GPU tests that cover every rung (and the 16-bit epilogues),
# compute-sanitizer on it, then the steady-state sweep with it.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache
timeout -k 5 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_wgmma_store.py \
  tests/test_hopper.py tests/test_out16.py tests/test_kernels.py tests/test_ladder.py \
  tests/test_tensor_cores.py tests/test_nonfinite.py -k "store or hopper or out16 or ladder" \
  > $OUT/pytest-store-$TAG.log 2>&1
tail -n 2 $OUT/pytest-store-$TAG.log
OUT=$OUT timeout -k 5 150 bash scripts/sanitize_hopper.sh --kernels wgmma_store:fp16,wgmma_store:bf16 \
  --deadline 130 > $OUT/sanitize-store-$TAG.log 2>&1
tail -n 6 $OUT/sanitize-store-$TAG.log
rm -rf $OUT/sanitize-hopper
(cd results/loopgap-2026-11-25 && CANDS=ws3,ws4,ws3_o16,st,st_o16 timeout -k 5 ${LIMIT:-230} \
  python3 steady_gpu.py $OUT/steady-store-$TAG.json) > $OUT/steady-store-$TAG.log 2>&1
grep -v warmed $OUT/steady-store-$TAG.log | awk '{printf "%s %s %-9s %8s %8s %7s\n",$1,$2,$3,$5,$8,$10}'
