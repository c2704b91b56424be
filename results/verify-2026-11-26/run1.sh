#!/bin/bash
# From the repository root on a GPU machine: bash results/verify-2026-11-26/run1.sh OUTDIR
# The first GPU run on fb61aef (the review mends, which no GPU had run).  On an H200: issue
# 19's run6.sh (the whole GPU suite, then the final power-cap loop, tag h200).  Otherwise:
# the whole GPU suite, then the all-precision call path on torch tensors (host cost and
# loops, callpath_gpu.py) after the launch refactor.
set -u
OUT=${1:-$OUT}
if nvidia-smi -L | grep -q H200; then
  T_SUITE=380 T_STEADY=150 bash results/epilogue-2026-11-26/run6.sh $OUT
  exit
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv \
  > $OUT/gpu-suite-h100.log
timeout -k 5 400 python3 -m pytest -q -m gpu -p no:cacheprovider tests \
  >> $OUT/gpu-suite-h100.log 2>&1
echo "suite rc=$?" >> $OUT/gpu-suite-h100.log
tail -n 3 $OUT/gpu-suite-h100.log
grep -E "^FAILED|^ERROR" $OUT/gpu-suite-h100.log | head -20
timeout -k 5 170 python3 results/callpath-2026-11-25/callpath_gpu.py $OUT/callpath-h100.json \
  > $OUT/callpath-h100.log 2>&1
echo "callpath rc=$?" >> $OUT/callpath-h100.log
cat $OUT/callpath-h100.log
