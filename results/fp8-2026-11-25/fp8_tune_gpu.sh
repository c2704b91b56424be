#!/usr/bin/env bash
# One GPU call: the FP8 variants, then Nsight Compute on one gemmlib FP8 call and one
# torch._scaled_mm call at 4096^3 (--clock-control none).  Usage: bash fp8_tune_gpu.sh OUTDIR
set -uo pipefail
cd "$(dirname "$0")/../.."
OUTDIR=${1:-$OUT}
mkdir -p $OUTDIR
timeout -k 5 240 python3 results/fp8-2026-11-25/fp8_tune_gpu.py $OUTDIR tune 2>&1 | grep -v -i warn | tee $OUTDIR/fp8-tune.log | tail -20
timeout -k 5 200 ncu --clock-control none --section SpeedOfLight --section Occupancy \
  --section WarpStateStats --section LaunchStats --csv --page details \
  -k regex:"wgmma|nvjet|sm90|gemm|transpose" --launch-skip 2 --launch-count 4 \
  python3 results/fp8-2026-11-25/fp8_tune_gpu.py $OUTDIR ncu > $OUTDIR/fp8-ncu.csv 2> $OUTDIR/fp8-ncu.err
echo "ncu rc=$? lines $(wc -l < $OUTDIR/fp8-ncu.csv)"
