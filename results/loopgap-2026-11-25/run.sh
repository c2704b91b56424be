#!/bin/bash
# From the repository root on a GPU machine: bash results/loopgap-2026-11-25/run.sh OUTDIR TAG
set -u
OUT=${1:-$OUT}; TAG=${2:-gpu}
export PYTHONPATH=$PWD:${PYTHONPATH:-} NUMBA_ENABLE_CUDASIM=0 GEMMLIB_CACHE=$PWD/kcache
nvidia-smi > $OUT/nvidia-smi-$TAG.txt 2>&1
(cd results/loopgap-2026-11-25 && timeout -k 5 400 python3 loopgap_gpu.py $OUT/loopgap-$TAG.json \
  ${SIZES:-4096,8192,2048}) > $OUT/loopgap-$TAG.log 2>&1
timeout -k 5 150 python3 scripts/host_profile.py $OUT/host-profile-$TAG.json > $OUT/host-profile-$TAG.log 2>&1
tail -n 3 $OUT/*.log
