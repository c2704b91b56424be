#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run6.sh OUTDIR
# The session's last verification on the final code: the whole GPU suite, then the power-cap
# loop of run5.sh. The tag is the GPU: h200, or h100-2 for a second H100 run.
set -u
OUT=${1:-$OUT}
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 \
  || echo h100-2)
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit,driver_version --format=csv \
  > $OUT/gpu-suite-$TAG.log 2>&1
timeout -k 5 ${T_SUITE:-400} python3 -m pytest -q -m gpu -p no:cacheprovider tests \
  >> $OUT/gpu-suite-$TAG.log 2>&1
echo "suite rc=$?" >> $OUT/gpu-suite-$TAG.log
tail -n 3 $OUT/gpu-suite-$TAG.log
T_STEADY=${T_STEADY:-170} bash results/epilogue-2026-11-26/run5.sh $OUT $TAG
