#!/bin/bash
# From the repository root on a GPU machine: bash results/epilogue-2026-11-26/run7.sh OUTDIR TAG
# Why 2048^3 is bimodal for the 16-bit auto (blocks of 29-31 us and of 36-38 us, torch's
# steady: steady-final-h100*.json): 21 blocks of auto, st4p2_o16 (the same kernel by name)
# and ws3_o16 beside torch.matmul, each block's start time and wall time per call, and the SM
# clock, power and throttle reasons from nvidia-smi every 50 ms over the whole run.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache \
  PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active \
  --format=csv,nounits -lms 50 > $OUT/clock2048-$TAG.csv 2>&1 &
SMI=$!
(cd results/loopgap-2026-11-25 && BLOCKS=21 CANDS=st4p2_o16,ws3_o16 timeout -k 5 \
  ${T_STEADY:-200} python3 steady_gpu.py $OUT/steady-2048-$TAG.json fp16,bf16 2048x2048x2048) \
  > $OUT/steady-2048-$TAG.log 2>&1
kill $SMI
grep -v warmed $OUT/steady-2048-$TAG.log | awk '{printf "%s %s %-9s %-34s %8s %8s %7s\n",$1,$2,$3,$4,$5,$8,$10}'
python3 - $OUT/steady-2048-$TAG.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["precision"], r["label"], " ".join(f"{x:5.1f}" for x in r["blocks_us"]))
    print("   wall/call", " ".join(f"{x:5.1f}" for x in r["block_wall_us"][1::2]))
PY
