#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/run3.sh OUTDIR
# Nsight Compute on issue 19's squares (scripts/ncu_models.py, NCU_CASES=hopper), then
# compute-sanitizer synccheck on wgmma_pingpong with 32 tracked barriers.
set -u
export OUT=${1:-$OUT} NCU_CASES=hopper GEMMLIB_CACHE=$PWD/kcache
timeout -k 5 330 bash scripts/ncu_models.sh > $OUT/ncu-run.log 2>&1
tail -n 12 $OUT/ncu-models.md
timeout -k 5 230 bash scripts/sanitize_hopper.sh --kernels wgmma_pingpong:fp16,wgmma_pingpong:bf16 \
  --tools synccheck --deadline 200 > $OUT/sanitize-pingpong.log 2>&1
tail -n 12 $OUT/sanitize-pingpong.log
