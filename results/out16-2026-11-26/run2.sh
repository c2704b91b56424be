#!/bin/bash
# From the repository root on a GPU machine: bash results/out16-2026-11-26/run2.sh OUTDIR [PART]
# After skinny sums its K slices itself (one launch) and writes 16 bits: PART 1 = the whole
# GPU suite and the host cost piece by piece (hostparts_gpu.py); PART 2 = loops of calls at
# decode and small-batch shapes against torch.matmul (steady-small) and chapter 18 executed.
set -u
OUT=${1:-$OUT}; PART=${2:-1}
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 \
  || echo h100)
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
if [ "$PART" = 1 ]; then
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv \
    > $OUT/gpu-suite-$TAG.log
  timeout -k 5 ${T_SUITE:-420} python3 -m pytest -q -m gpu -p no:cacheprovider tests \
    >> $OUT/gpu-suite-$TAG.log 2>&1
  echo "suite rc=$?" >> $OUT/gpu-suite-$TAG.log
  tail -n 3 $OUT/gpu-suite-$TAG.log
  grep -E "^FAILED|^ERROR" $OUT/gpu-suite-$TAG.log | head -20
  timeout -k 5 100 python3 results/out16-2026-11-26/hostparts_gpu.py \
    $OUT/hostparts-after-$TAG.json > $OUT/hostparts-after-$TAG.log 2>&1
  cat $OUT/hostparts-after-$TAG.log
else
  (cd results/loopgap-2026-11-25 && BLOCKS=${BLOCKS:-7} CANDS=none timeout -k 5 200 \
    python3 steady_gpu.py $OUT/steady-small-after-$TAG.json fp16,bf16 ${SHAPES:-1x6144x4096,1x4096x4096,1x28672x4096,1x4096x14336,4x4096x4096,16x4096x4096,64x4096x4096,128x4096x14336}) \
    > $OUT/steady-small-after-$TAG.log 2>&1
  grep -v warmed $OUT/steady-small-after-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
  timeout -k 5 240 python3 scripts/execute_notebooks.py chapters/18-models.ipynb \
    > $OUT/notebooks-$TAG.log 2>&1
  tail -n 3 $OUT/notebooks-$TAG.log
  mkdir -p $OUT/chapters && cp chapters/18-models.ipynb $OUT/chapters/
fi
