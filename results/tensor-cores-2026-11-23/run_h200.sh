#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/../.."
source .whl/env.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} GEMMLIB_CACHE=/tmp/gcache PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0
mkdir -p $OUT/logs
touch /tmp/marker
save() { find results -newer /tmp/marker -type f | tar cf $OUT/results.tar -T - 2>/dev/null; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for st in "roof 40 python3 scripts/mma_roof.py --chains 8 16" \
          "tune3x 70 python3 scripts/tune_tc.py --precisions 3xtf32 --shapes 4096 8192" \
          "acc3x 40 python3 results/tensor-cores-2026-11-23/i12_s3.py accuracy" "bench3x 50 python3 results/tensor-cores-2026-11-23/i12_s3.py bench"; do
  set -- $st; name=$1; t=$2; shift 2
  s=$SECONDS; timeout $t "$@" > $OUT/logs/$name.log 2>&1; echo "=== $name rc=$? $((SECONDS-s)) s"
  grep -v -i warn $OUT/logs/$name.log | tail -12; save
done
