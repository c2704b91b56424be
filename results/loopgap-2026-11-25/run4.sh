#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/run4.sh OUTDIR TAG
# wgmma_store (the epilogue through shared memory): its GPU tests, kernel timing beside
# wgmma_ws and the store-less diagnostic, then the steady-state sweep with it.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache
timeout -k 5 200 python3 -m pytest -q -m gpu tests/test_wgmma_store.py -p no:cacheprovider \
  > $OUT/pytest-store-$TAG.log 2>&1
tail -n 2 $OUT/pytest-store-$TAG.log
(cd results/loopgap-2026-11-25 && GEMMLIB_CACHE=/tmp/expcache timeout -k 5 150 python3 \
  epilogue_gpu.py $OUT/epilogue-$TAG.json > $OUT/epilogue-$TAG.log 2>&1)
grep -E "cublas|store " $OUT/epilogue-$TAG.log
(cd results/loopgap-2026-11-25 && CANDS=ws3,ws4,ws3_o16,st,st_o16 timeout -k 5 ${LIMIT:-300} \
  python3 steady_gpu.py $OUT/steady-store-$TAG.json) > $OUT/steady-store-$TAG.log 2>&1
grep -v warmed $OUT/steady-store-$TAG.log | awk '{printf "%s %s %-9s %8s %8s %7s\n",$1,$2,$3,$5,$8,$10}'
