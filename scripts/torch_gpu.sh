#!/usr/bin/env bash
# The GPU run of the torch front end, on one GPU, from the repository root:
#   tests     CUDA graphs, torch.compile, the no-CuPy process, and the torch/stream tests
#   hostcost  python -m gemmlib bench --host-cost (torch_ratio per case)
#   profile   scripts/host_profile.py: each step of the short path timed alone
#   e2e       python -m gemmlib bench --suite e2e (E2E_ARGS)
# Logs and result files go to $OUT (default /tmp/torch-out).  Environment: STEPS,
# T_TESTS, T_E2E (seconds per step), TEST_FILES, PYTEST_ARGS, E2E_ARGS.
set -uo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 CUPY_TF32=0
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" GEMMLIB_CACHE=${GEMMLIB_CACHE:-/tmp/gcache}
OUT=${OUT:-/tmp/torch-out}
mkdir -p "$OUT" results
STEPS=${STEPS:-"tests hostcost"}
TEST_FILES=${TEST_FILES:-"tests/test_torch_graphs.py tests/test_torch_op.py tests/test_frameworks.py tests/test_streams.py"}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit \
  --format=csv,noheader | tee "$OUT/gpu.txt"
for step in $STEPS; do
  t0=$SECONDS
  case $step in
    tests) timeout "${T_TESTS:-400}" python3 -m pytest $TEST_FILES -m gpu -q -rfE ${PYTEST_ARGS:-} \
             -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests.log" 2>&1
           echo "=== tests rc=$? after $((SECONDS - t0)) s"; tail -n 30 "$OUT/tests.log" ;;
    hostcost) timeout 300 python3 -m gemmlib bench --host-cost --out "$OUT" > "$OUT/hostcost.log" 2>&1
           echo "=== hostcost rc=$? after $((SECONDS - t0)) s"; tail -n 30 "$OUT/hostcost.log" ;;
    profile) timeout 200 python3 scripts/host_profile.py "$OUT/host-profile.json" > "$OUT/profile.log" 2>&1
           echo "=== profile rc=$? after $((SECONDS - t0)) s"; tail -n 60 "$OUT/profile.log" ;;
    e2e) timeout "${T_E2E:-500}" python3 -m gemmlib bench --suite e2e --out "$OUT" ${E2E_ARGS:-} \
             > "$OUT/e2e.log" 2>&1
           echo "=== e2e rc=$? after $((SECONDS - t0)) s"; tail -n 40 "$OUT/e2e.log" ;;
  esac
done
