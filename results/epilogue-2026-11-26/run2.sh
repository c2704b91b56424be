#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run2.sh OUTDIR TAG
# After "auto" with a 16-bit out moved to wgmma_store (4 stages, the tile staged in two
# halves: dispatch.HOPPER_OUT16): the whole GPU suite, then "auto" (16-bit and float32 out)
# beside wgmma_ws_o16 in a loop at the power cap against torch.matmul on issue 19's squares
# and the model shapes with M >= 4096 (../loopgap-2026-11-25/steady_gpu.py's default shapes).
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv \
  > $OUT/gpu-suite-$TAG.log 2>&1
set -o pipefail
timeout -k 5 ${T_SUITE:-420} python3 -m pytest -q -m gpu -p no:cacheprovider tests \
  >> $OUT/gpu-suite-$TAG.log 2>&1
echo "suite rc=$?" >> $OUT/gpu-suite-$TAG.log
tail -n 4 $OUT/gpu-suite-$TAG.log
(cd results/loopgap-2026-11-25 && CANDS=${CANDS:-ws3_o16} timeout -k 5 ${T_STEADY:-160} \
  python3 steady_gpu.py $OUT/steady-auto-$TAG.json fp16,bf16 ${SHAPES:-}) \
  > $OUT/steady-auto-$TAG.log 2>&1
grep -v warmed $OUT/steady-auto-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
