#!/bin/bash
# From the repository root on a GPU machine: bash results/out16-2026-11-26/run3.sh OUTDIR PART
# PART 1: the whole GPU suite (its 2-GPU test too, on a machine with two), then on an H200
# issue 19's final loop (../epilogue-2026-11-26/run5.sh, tag h200) and the host cost of a
# 16-bit call (host16_gpu.py).  PART 2: compute-sanitizer on wgmma_store (auto's 16-bit
# build included: --kernels hopper's), then chapter 17 and the leaderboard executed.
set -u
OUT=${1:-$OUT}; PART=${2:-1}
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
N=$(nvidia-smi -L | wc -l)
TAG=$(echo $G | grep -q H200 && echo h200 || echo h100)x$N
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
if [ "$PART" = 1 ]; then
  nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv \
    > $OUT/gpu-suite-$TAG.log
  timeout -k 5 ${T_SUITE:-380} python3 -m pytest -q -m gpu -p no:cacheprovider tests \
    >> $OUT/gpu-suite-$TAG.log 2>&1
  echo "suite rc=$?" >> $OUT/gpu-suite-$TAG.log
  tail -n 3 $OUT/gpu-suite-$TAG.log
  grep -E "^FAILED|^ERROR" $OUT/gpu-suite-$TAG.log | head -20
  timeout -k 5 60 python3 results/out16-2026-11-26/host16_gpu.py $OUT/host16-after-$TAG.json \
    > $OUT/host16-after-$TAG.log 2>&1
  tail -n 6 $OUT/host16-after-$TAG.log
  if echo $G | grep -q H200; then
    T_STEADY=${T_STEADY:-150} bash results/epilogue-2026-11-26/run5.sh $OUT h200
  fi
else
  # auto's 16-bit builds: wgmma_store (4 stages, two pieces) and its 3-stage build; the
  # 16-bit split-K (64-row tiles: the small-batch choice) and the decode rung with its
  # in-launch slice sums (5x520x1100/3: three slices of a skinny product)
  OUT=/tmp/san1 timeout -k 5 100 bash scripts/sanitize_hopper.sh \
    --kernels wgmma_store:fp16,wgmma_store:bf16,wgmma_store:fp16:STAGES=4:PIECES=2:OUT=fp16,wgmma_store:bf16:STAGES=4:PIECES=2:OUT=bf16 \
    --deadline 80 > $OUT/sanitize-store-$TAG.log 2>&1
  tail -n 8 $OUT/sanitize-store-$TAG.log
  OUT=/tmp/san2 timeout -k 5 100 bash scripts/sanitize_hopper.sh \
    --kernels wgmma_split_k:fp16:BM=64:OUT=fp16,wgmma_split_k:bf16:OUT=bf16,skinny:fp16:MT=1:U=8:OUT=fp16,skinny:bf16:MT=4:OUT=bf16 \
    --shapes 67x45x37,tile+,5x520x1100/3,300x520x528@4/3 --deadline 80 \
    > $OUT/sanitize-o16-$TAG.log 2>&1
  tail -n 8 $OUT/sanitize-o16-$TAG.log
  for d in 1 2; do
    n=$([ $d = 1 ] && echo store || echo o16)
    cp /tmp/san$d/sanitize-hopper/sanitize.json $OUT/sanitize-$n-$TAG.json 2>/dev/null
    cp /tmp/san$d/sanitize-hopper/logs.tgz $OUT/sanitize-$n-logs-$TAG.tgz 2>/dev/null
  done
  timeout -k 5 300 python3 scripts/execute_notebooks.py chapters/17-hopper.ipynb \
    chapters/leaderboard.ipynb > $OUT/notebooks-$TAG.log 2>&1
  tail -n 5 $OUT/notebooks-$TAG.log
  mkdir -p $OUT/chapters && cp chapters/17-hopper.ipynb chapters/leaderboard.ipynb $OUT/chapters/
fi
