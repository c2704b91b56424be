#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/steady.sh OUTDIR TAG
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache
(cd results/loopgap-2026-11-25 && timeout -k 5 ${LIMIT:-520} python3 steady_gpu.py \
  $OUT/steady-$TAG.json ${PRECS:-fp16,bf16} ${SHAPES:-}) > $OUT/steady-$TAG.log 2>&1
tail -n 3 $OUT/steady-$TAG.log
