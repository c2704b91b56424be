#!/usr/bin/env bash
# Issue 12, session 3: one GPU run (device time is short). Stages with their own limits;
# results and logs copied to $OUT after every stage.
set -uo pipefail
cd "$(dirname "$0")/../.."
source .whl/env.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-} GEMMLIB_CACHE=/tmp/gcache PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0
mkdir -p $OUT/logs /tmp/gcache/kernels
touch /tmp/marker
T0=$SECONDS
save() { find results -newer /tmp/marker -type f | tar cf $OUT/results.tar -T - 2>/dev/null; }
stage() {
  local name=$1 t=$2; shift 2
  local s=$SECONDS
  echo "=== $name (limit $t s, at $((SECONDS - T0)) s)"
  timeout $t "$@" > $OUT/logs/$name.log 2>&1
  echo "=== $name rc=$? after $((SECONDS - s)) s"
  grep -v -i "warn" $OUT/logs/$name.log | tail -n ${TAILN:-25}
  save
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
stage roof 50 python3 scripts/mma_roof.py --chains 8 16
stage tune3x 110 python3 scripts/tune_tc.py --precisions 3xtf32 --shapes 4096 8192
stage acc3x 50 python3 results/tensor-cores-2026-11-23/i12_s3.py accuracy
stage bench3x 70 python3 results/tensor-cores-2026-11-23/i12_s3.py bench
TAILN=40 stage pytest 150 env GEMMLIB_GPU_SHAPES=24 GEMMLIB_REPORT_DIR=$OUT/reports python3 -m pytest -q -rfE -m gpu -k "mma or tensor" -p no:cacheprovider tests
stage sanitize 60 python3 scripts/sanitize.py --kernels mma_pipeline,mma_pipeline:3xtf32,mma_swizzle --tools memcheck,racecheck --jobs 6 --timeout 55 --shapes 67x45x37,tile+ --out $OUT/sanitize
cat > /tmp/ncu_target.py <<'PY'
import cupy as cp, gemmlib
A = cp.random.rand(4096, 4096).astype(cp.float16); B = cp.random.rand(4096, 4096).astype(cp.float16)
gemmlib.matmul(A, B); cp.cuda.runtime.deviceSynchronize()
PY
TAILN=60 stage ncu 45 bash -c "ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats --section Occupancy -k regex:mma_pipeline -c 1 python3 /tmp/ncu_target.py"
echo "total $((SECONDS - T0)) s"
