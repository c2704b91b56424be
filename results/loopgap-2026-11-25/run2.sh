#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/run2.sh OUTDIR TAG
# The call-path GPU tests, the host profile, then the steady-state sweep.
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache
timeout -k 5 240 python3 -m pytest -q -m gpu tests/test_frameworks.py tests/test_dispatch.py \
  tests/test_streams.py tests/test_skinny.py tests/test_wgmma_split_k.py > $OUT/pytest-callpath-$TAG.log 2>&1
tail -n 2 $OUT/pytest-callpath-$TAG.log
timeout -k 5 150 python3 scripts/host_profile.py $OUT/host-profile-$TAG.json > $OUT/host-profile-$TAG.log 2>&1
(cd results/loopgap-2026-11-25 && timeout -k 5 ${LIMIT:-420} python3 steady_gpu.py \
  $OUT/steady-$TAG.json ${PRECS:-fp16,bf16} ${SHAPES:-}) > $OUT/steady-$TAG.log 2>&1
tail -n 2 $OUT/steady-$TAG.log
