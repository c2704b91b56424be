#!/bin/bash
# From the repository root on a GPU machine: bash results/out16-2026-11-26/run5.sh OUTDIR
# The session's last verification on the final code.  On an H200: issue 19's run6.sh (the
# whole GPU suite, then the final power-cap loop, tag h200).  Otherwise: the whole GPU suite,
# then loops of 16-bit calls against torch.matmul at decode and small-batch shapes
# (steady-small-final) after skinny's single launch and the M = 1 rule.
set -u
OUT=${1:-$OUT}
if nvidia-smi -L | grep -q H200; then
  T_SUITE=380 T_STEADY=150 bash results/epilogue-2026-11-26/run6.sh $OUT
  exit
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv \
  > $OUT/gpu-suite-final-h100.log
timeout -k 5 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests \
  >> $OUT/gpu-suite-final-h100.log 2>&1
echo "suite rc=$?" >> $OUT/gpu-suite-final-h100.log
tail -n 3 $OUT/gpu-suite-final-h100.log
grep -E "^FAILED|^ERROR" $OUT/gpu-suite-final-h100.log | head -20
(cd results/loopgap-2026-11-25 && BLOCKS=7 CANDS=none timeout -k 5 150 \
  python3 steady_gpu.py $OUT/steady-small-final-h100.json fp16,bf16 \
  1x4096x4096,2x4096x4096,4x4096x4096,4x6144x4096,4x4096x14336,16x4096x4096,1x6144x4096) \
  > $OUT/steady-small-final-h100.log 2>&1
grep -v warmed $OUT/steady-small-final-h100.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
