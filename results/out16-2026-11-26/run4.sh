#!/bin/bash
# From the repository root on a GPU machine: bash results/out16-2026-11-26/run4.sh OUTDIR
# After skinny's last block loads four slices at a time: its GPU tests and the 16-bit ones,
# the decode kernels alone again (decode_kernels_gpu.py; the first run, before this change,
# is decode-kernels-h100.json) and compute-sanitizer on skinny's 16-bit builds.
set -u
OUT=${1:-$OUT}
TAG=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 \
  || echo h100)
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
timeout -k 5 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_skinny.py \
  tests/test_out16.py tests/test_models_suite.py > $OUT/tests-unroll-$TAG.log 2>&1
tail -n 2 $OUT/tests-unroll-$TAG.log
timeout -k 5 120 python3 results/out16-2026-11-26/decode_kernels_gpu.py \
  $OUT/decode-kernels-unroll-$TAG.json > $OUT/decode-kernels-unroll-$TAG.log 2>&1
grep -v -i warn $OUT/decode-kernels-unroll-$TAG.log
OUT=/tmp/san3 timeout -k 5 100 bash scripts/sanitize_hopper.sh \
  --kernels skinny:fp16:MT=1:U=8:OUT=fp16,skinny:bf16:MT=4:OUT=bf16,skinny:fp16:MT=4:SPLITS=9 \
  --shapes 67x45x37,5x520x1100/6,3x520x2600/9 --deadline 80 > $OUT/sanitize-unroll-$TAG.log 2>&1
tail -n 6 $OUT/sanitize-unroll-$TAG.log
