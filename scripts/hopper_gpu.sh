#!/usr/bin/env bash
# Issue 13 GPU runs (Hopper rungs): stages with their own time limits; logs to $OUT/logs,
# new result files to $OUT/results.tar.  Usage: bash scripts/hopper_gpu.sh STAGE... with
# stages probe verify tune final profile pytest sanitize ncu (see scripts/hopper_gpu.py).
set -uo pipefail
cd "$(dirname "$0")/.."
source .whl/env.sh >/dev/null 2>&1
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
  grep -v -i "warn" $OUT/logs/$name.log | tail -n ${TAILN:-30}
  save
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
for st in "$@"; do
  case $st in
    probe) stage probe 90 python3 -m gemmcourse.hopper_probe ;;
    verify) TAILN=40 stage verify 300 python3 scripts/hopper_gpu.py verify ${VERIFY:-} ;;
    tune) stage tune 200 python3 scripts/hopper_gpu.py tune 8192 ;;
    bench) TAILN=40 stage bench 300 python3 scripts/hopper_gpu.py bench ;;
    final) TAILN=80 stage final 300 python3 scripts/hopper_gpu.py final ;;
    profile) TAILN=60 stage profile 60 python3 scripts/hopper_gpu.py profile ;;
    pytest) TAILN=30 stage pytest ${PYT:-200} env GEMMLIB_GPU_SHAPES=12 GEMMLIB_REPORT_DIR=$OUT/reports python3 -m pytest -q -rfE -m gpu -k "wgmma or hopper or tensor" -p no:cacheprovider tests ;;
    sanitize) TAILN=30 stage sanitize 150 python3 scripts/sanitize.py --kernels wgmma_ws,wgmma_tma,wgmma_async,wgmma_ws:bf16 --tools memcheck,racecheck --jobs 8 --timeout 100 --shapes 67x45x37,tile+ --out $OUT/sanitize ;;
    ncu) TAILN=60 stage ncu 60 bash -c "ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats -k regex:wgmma_ws -c 1 python3 scripts/hopper_gpu.py ncu" ;;
    *) echo "unknown stage $st" ;;
  esac
done
echo "total $((SECONDS - T0)) s"
