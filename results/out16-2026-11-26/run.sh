#!/bin/bash
# From the repository root on a GPU machine: bash results/out16-2026-11-26/run.sh OUTDIR
# The 16-bit C where no epilogue wrote it (decode: skinny; deep K: split-K): the GPU tests
# of the 16-bit paths, the host cost of one call (host16_gpu.py) and loops of calls against
# torch.matmul at decode and small-batch shapes (../loopgap-2026-11-25/steady_gpu.py).
set -u
OUT=${1:-$OUT}
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 \
  || echo h100)
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,driver_version --format=csv \
  > $OUT/tests-rounded-$TAG.log
timeout -k 5 ${T_TEST:-240} python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_out16.py \
  tests/test_wgmma_split_k.py tests/test_skinny.py tests/test_nonfinite.py \
  tests/test_dispatch.py tests/test_streams.py >> $OUT/tests-rounded-$TAG.log 2>&1
tail -n 3 $OUT/tests-rounded-$TAG.log
timeout -k 5 120 python3 results/out16-2026-11-26/host16_gpu.py $OUT/host16-rounded-$TAG.json \
  > $OUT/host16-rounded-$TAG.log 2>&1
cat $OUT/host16-rounded-$TAG.log
(cd results/loopgap-2026-11-25 && BLOCKS=${BLOCKS:-7} CANDS=none timeout -k 5 ${T_STEADY:-200} \
  python3 steady_gpu.py $OUT/steady-small-rounded-$TAG.json fp16,bf16 ${SHAPES:-1x6144x4096,1x4096x4096,1x28672x4096,1x4096x14336,4x4096x4096,16x4096x4096,64x4096x4096,128x4096x14336}) \
  > $OUT/steady-small-rounded-$TAG.log 2>&1
grep -v warmed $OUT/steady-small-rounded-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
