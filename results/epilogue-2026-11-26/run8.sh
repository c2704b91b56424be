#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run8.sh OUTDIR TAG
# 2048^3 has 128 tiles of 128 x 256 for 132 SMs: one per SM, nothing hides the fill or the
# store. wgmma_store with 128 x 128 tiles (4 or 6 stages) gives each SM two, the first one's
# store under the second's mainloop. Beside auto at the power cap, 2048^3, 2048x4096x2048
# and 4096^3.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
(cd results/loopgap-2026-11-25 && BLOCKS=9 CANDS=st128s4_o16,st128s6_o16 timeout -k 5 \
  ${T_STEADY:-300} python3 steady_gpu.py $OUT/steady-bn128-$TAG.json fp16,bf16 \
  2048x2048x2048,2048x4096x2048,4096x4096x4096) > $OUT/steady-bn128-$TAG.log 2>&1
grep -v warmed $OUT/steady-bn128-$TAG.log | awk '{printf "%s %s %-11s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
