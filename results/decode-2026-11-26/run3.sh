#!/bin/bash
# From the repository root on a GPU machine: bash results/decode-2026-11-26/run3.sh OUTDIR
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on the changed decode rung:
# auto's M = 1 builds (PIPE, fp16 and bf16, 16-bit C), the M = 4 build (U = 8), MT = 16
# (its groups' sums two at a time: G = 2 < KT = 8) and fp32 MT = 8; one slice, 3 slices and
# 17 (the last block's two batches of 16 loads).
set -u
OUT=${1:-$OUT}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
OUT=/tmp/san timeout -k 5 280 bash scripts/sanitize_hopper.sh \
  --kernels skinny:fp16:MT=1:U=4:PIPE=1:OUT=fp16,skinny:bf16:MT=1:U=4:PIPE=1:OUT=bf16,skinny:fp16:MT=4:U=8:OUT=fp16,skinny:fp16:MT=16,skinny:fp32:MT=8 \
  --shapes 67x45x37,5x520x1100/3,3x520x4400/17 --deadline 250 > $OUT/sanitize-h100.log 2>&1
tail -n 12 $OUT/sanitize-h100.log
cp /tmp/san/sanitize-hopper/sanitize.json $OUT/sanitize-h100.json 2>/dev/null
cp /tmp/san/sanitize-hopper/logs.tgz $OUT/sanitize-logs-h100.tgz 2>/dev/null
