#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run9.sh OUTDIR TAG
# Shapes the switch of auto's 16-bit C to wgmma_store was not chosen on: prefill-sized M
# (512-2048 tokens), where auto now picks it, beside wgmma_ws_o16 (the choice before) and
# torch.matmul at the power cap.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
(cd results/loopgap-2026-11-25 && BLOCKS=7 CANDS=ws3_o16 timeout -k 5 ${T_STEADY:-300} \
  python3 steady_gpu.py $OUT/steady-prefill-$TAG.json fp16,bf16 \
  512x6144x4096,1024x4096x4096,1024x14336x4096,1024x4096x14336,2048x8192x2048) \
  > $OUT/steady-prefill-$TAG.log 2>&1
grep -v warmed $OUT/steady-prefill-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
