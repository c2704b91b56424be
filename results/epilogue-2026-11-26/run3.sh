#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run3.sh OUTDIR TAG
# After the steady-state probe fix (../loopgap-2026-11-25/steady_gpu.py: blocks of BLOCK_S,
# not of the first cold calls; 7 blocks): "auto" (16-bit out: wgmma_store, 4 stages, two
# pieces; float32 out) beside wgmma_ws_o16 at the power cap on issue 19's squares and the
# model shapes with M >= 4096; then Nsight Compute on issue 19's squares
# (scripts/ncu_models.py, NCU_CASES=hopper: auto float32, auto 16-bit out, torch.matmul).
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
(cd results/loopgap-2026-11-25 && CANDS=${CANDS:-ws3_o16} timeout -k 5 ${T_STEADY:-240} \
  python3 steady_gpu.py $OUT/steady-fixed-$TAG.json fp16,bf16 ${SHAPES:-}) \
  > $OUT/steady-fixed-$TAG.log 2>&1
grep -v warmed $OUT/steady-fixed-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
mkdir -p $OUT/ncu
OUT=$OUT/ncu NCU_CASES=hopper timeout -k 5 ${T_NCU:-300} bash scripts/ncu_models.sh \
  > $OUT/ncu/ncu-run.log 2>&1
tail -n 16 $OUT/ncu/ncu-models.md
rm -f $OUT/ncu/ncu-trial.txt $OUT/ncu/ncu-warm.log
