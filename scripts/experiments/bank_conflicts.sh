#!/usr/bin/env bash
# Shared-memory bank conflicts of each rung, measured by Nsight Compute, beside
# gemmlib.banks' prediction.  On a GPU machine, from the repository root:
#   bash scripts/experiments/bank_conflicts.sh [SIZE] [KERNEL ...]   (default 512, the shared-memory rungs)
# (results/tuning/ncu-bank-conflicts-h200-512.txt is its output at 512^3 on an H200.)
# Every rung is launched twice (a small compile run, then SIZE^3); compare the
# second half of the ncu rows with the "model predicts" lines.
set -euo pipefail
cd "$(dirname "$0")/../.."   # the repository root
export NUMBA_ENABLE_CUDASIM=0
PY=${PY:-python3}
M=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
M=$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
M=$M,smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
# -k: only gemmlib's kernels (numba names them <module>...<name>_kernel...), not CuPy's
ncu --clock-control none --metrics "$M" -k regex:_kernel \
  $PY scripts/experiments/bank_conflicts.py "${1:-512}" "${@:2}"
