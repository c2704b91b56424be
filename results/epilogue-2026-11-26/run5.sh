#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run5.sh OUTDIR TAG
# The final power-cap loop for issue 19's table: "auto" (16-bit out: wgmma_store, 4 stages,
# two pieces; float32 out: wgmma_split_k) and the former 16-bit choice wgmma_ws_o16 against
# torch.matmul, with the probe fix and an unrecorded first block per candidate
# (../loopgap-2026-11-25/steady_gpu.py), 9 blocks, on the squares and the model shapes.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv > $OUT/gpu-$TAG.txt
(cd results/loopgap-2026-11-25 && BLOCKS=${BLOCKS:-9} CANDS=${CANDS:-ws3_o16} timeout -k 5 \
  ${T_STEADY:-400} python3 steady_gpu.py $OUT/steady-final-$TAG.json fp16,bf16 ${SHAPES:-}) \
  > $OUT/steady-final-$TAG.log 2>&1
grep -v warmed $OUT/steady-final-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
