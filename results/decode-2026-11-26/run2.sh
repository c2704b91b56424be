#!/bin/bash
# From the repository root on a GPU machine: bash results/decode-2026-11-26/run2.sh OUTDIR
# The session's last verification on the final code.  On an H200: issue 19's run6.sh (the
# whole GPU suite, then the final power-cap loop, tag h200).  Otherwise: the whole GPU
# suite, then the decode rung before (skinny_fb61aef.py) and after, kernel alone.
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
timeout -k 5 395 python3 -m pytest -q -m gpu -p no:cacheprovider tests \
  >> $OUT/gpu-suite-final-h100.log 2>&1
echo "suite rc=$?" >> $OUT/gpu-suite-final-h100.log
tail -n 3 $OUT/gpu-suite-final-h100.log
grep -E "^FAILED|^ERROR" $OUT/gpu-suite-final-h100.log | head -20
timeout -k 5 150 python3 results/decode-2026-11-26/skinny_compare_gpu.py \
  $OUT/skinny-compare-final-h100.json /tmp/skinny_fb61aef.py 2>&1 \
  | grep -v Warn > $OUT/skinny-compare-final-h100.log
cat $OUT/skinny-compare-final-h100.log
