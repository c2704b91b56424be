#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run4.sh OUTDIR TAG
# What "auto" now runs for a 16-bit C on Hopper (wgmma_store, 4 stages, two pieces):
# compute-sanitizer's four tools on it (fp16 and bf16, logs kept); the power-cap loop again
# at 4096^3 and 2048^3 with 11 blocks (steady-fixed had 7: the squares vary most); the call
# path with torch tensors (host microseconds at 64^3, loops on decode/prefill/square shapes:
# ../callpath-2026-11-25/callpath_gpu.py).
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
OUT=/tmp/san timeout -k 5 ${T_SAN:-150} bash scripts/sanitize_hopper.sh --kernels \
  wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2,wgmma_store:bf16:OUT=bf16:STAGES=4:PIECES=2 \
  --deadline 130 > $OUT/sanitize-st4p2-$TAG.log 2>&1
tail -n 6 $OUT/sanitize-st4p2-$TAG.log
cp /tmp/san/sanitize-hopper/sanitize.json $OUT/sanitize-st4p2-$TAG.json 2>/dev/null
cp /tmp/san/sanitize-hopper/logs.tgz $OUT/sanitize-st4p2-logs-$TAG.tgz 2>/dev/null
(cd results/loopgap-2026-11-25 && BLOCKS=11 CANDS=ws3_o16,st4p2_o16 timeout -k 5 \
  ${T_STEADY:-150} python3 steady_gpu.py $OUT/steady-repeat-$TAG.json fp16,bf16 \
  4096x4096x4096,2048x2048x2048) > $OUT/steady-repeat-$TAG.log 2>&1
grep -v warmed $OUT/steady-repeat-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
(cd results/callpath-2026-11-25 && timeout -k 5 ${T_CALL:-200} python3 callpath_gpu.py \
  $OUT/callpath-$TAG.json) > $OUT/callpath-$TAG.log 2>&1
cat $OUT/callpath-$TAG.log | grep -v Warn | tail -25
