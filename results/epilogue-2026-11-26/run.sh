#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run.sh OUTDIR TAG
# wgmma_store (the epilogue through shared memory and a TMA store): its GPU tests and the
# tests that cover every 16-bit epilogue and non-finite inputs, kernel timing beside
# wgmma_ws and its store-less twin (../loopgap-2026-11-25/epilogue_gpu.py), compute-sanitizer
# on it (fp16 and bf16), then call timing in a loop against torch.matmul at the power cap
# (../loopgap-2026-11-25/steady_gpu.py). At most 8 files come back: 6 here, sanitize.json and
# the sanitizer's per-run logs (sanitize-logs-TAG.tgz).
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version \
    --format=csv; python3 -c "import numba_cuda, cupy, torch; print(numba_cuda.__version__, \
    cupy.__version__, torch.__version__)"; } > $OUT/pytest-$TAG.log 2>&1
timeout -k 5 ${T_TEST:-300} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_wgmma_store.py \
  tests/test_out16.py tests/test_nonfinite.py tests/test_dispatch.py \
  -k "store or driver_launch" >> $OUT/pytest-$TAG.log 2>&1
tail -n 3 $OUT/pytest-$TAG.log
(cd results/loopgap-2026-11-25 && GEMMLIB_CACHE=/tmp/expcache timeout -k 5 ${T_EPI:-200} python3 \
  epilogue_gpu.py $OUT/epilogue-$TAG.json > $OUT/epilogue-$TAG.log 2>&1)
grep -E "cublas| 3 |store" $OUT/epilogue-$TAG.log
OUT=/tmp/san timeout -k 5 ${T_SAN:-200} bash scripts/sanitize_hopper.sh \
  --kernels wgmma_store:fp16,wgmma_store:bf16 --deadline 150 > $OUT/sanitize-$TAG.log 2>&1
tail -n 6 $OUT/sanitize-$TAG.log
cp /tmp/san/sanitize-hopper/sanitize.json $OUT/sanitize-$TAG.json 2>/dev/null
cp /tmp/san/sanitize-hopper/logs.tgz $OUT/sanitize-logs-$TAG.tgz 2>/dev/null
(cd results/loopgap-2026-11-25 && CANDS=${CANDS:-ws3,ws3_o16,st,st_o16,st4p2_o16} timeout -k 5 \
  ${T_STEADY:-240} python3 steady_gpu.py $OUT/steady-store-$TAG.json fp16,bf16 \
  ${SHAPES:-4096x4096x4096,8192x8192x8192,2048x2048x2048,4096x28672x4096}) \
  > $OUT/steady-store-$TAG.log 2>&1
grep -v warmed $OUT/steady-store-$TAG.log | awk '{printf "%s %s %-9s %8s %8s %7s\n",$1,$2,$3,$5,$8,$10}'
