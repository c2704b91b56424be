#!/usr/bin/env bash
# The unsigned-index experiment (the data is beside this script, in results/uidx-2026-11-22/):
# every rung as it was before gemmlib.intrinsics.index (commit 2586df0, extracted into
# exp/old_*.py) against the same rung with uidx, plus tile variants, timed by
# compare_variants.py (beside this script) on one GPU.  From the repository root:
#   prepare (needs git):  bash results/uidx-2026-11-22/uidx_experiment.sh --prepare
#   run (on the GPU):     OUT=out bash results/uidx-2026-11-22/uidx_experiment.sh
# (the run writes variants-big.*; the committed copies were renamed variants-large.*)
set -uo pipefail
cd "$(dirname "$0")/../.."   # the repository root
if [[ ${1:-} == --prepare ]]; then
  mkdir -p exp && touch exp/__init__.py
  for k in blocktile_1d blocktile_2d vectorized bank_free warptile layout_nt async_copy double_buffer; do
    git show 2586df0:gemmlib/kernels/$k.py > exp/old_$k.py
  done
  # the old rungs that build on other rungs must use the old versions of those too
  sed -i 's/^from gemmlib.kernels import vectorized/from exp import old_vectorized as vectorized/' \
    exp/old_bank_free.py
  sed -i 's/from gemmlib.kernels.layout_nt import/from exp.old_layout_nt import/; '\
's/from gemmlib.kernels.async_copy import/from exp.old_async_copy import/' \
    exp/old_async_copy.py exp/old_double_buffer.py
  exit 0
fi
OUT=${OUT:-$PWD/uidx-out}; mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 CUPY_TF32=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv > $OUT/gpu.txt
V=(--variant 1d_old=exp.old_blocktile_1d --variant 1d=blocktile_1d
   --variant 2d_old=exp.old_blocktile_2d --variant 2d=blocktile_2d --variant "2d_nocap=blocktile_2d:max_registers=None"
   --variant vec_old=exp.old_vectorized --variant vec=vectorized --variant "vec_nocap=vectorized:max_registers=None"
   --variant "vec_bk8_nocap=vectorized:BK=8,max_registers=None"
   --variant bf_old=exp.old_bank_free --variant bf=bank_free --variant "bf_nocap=bank_free:max_registers=None"
   --variant "bf_bk8_nocap=bank_free:BK=8,max_registers=None"
   --variant wt_old=exp.old_warptile --variant wt=warptile --variant "wt_bk16=warptile:BK=16"
   --variant "wt_256x128=warptile:BM=256,BN=128" --variant "wt_256x128x16=warptile:BM=256,BN=128,BK=16"
   --variant lnt_old=exp.old_layout_nt --variant lnt=layout_nt --variant "lnt_hand=layout_nt:indexing='hand'"
   --variant ac_old=exp.old_async_copy --variant ac=async_copy
   --variant db_old=exp.old_double_buffer --variant db=double_buffer)
timeout 330 python results/uidx-2026-11-22/compare_variants.py --shapes 4096 8192 4095x3073x2047 "${V[@]}" --reps 15 \
  --out $OUT/variants-big.json > $OUT/variants-big.log 2>&1; echo "big rc=$?" >> $OUT/variants-big.log
W=(--variant wt_old=exp.old_warptile --variant wt=warptile --variant "wt_bk16=warptile:BK=16"
   --variant "wt_64x128x16=warptile:BM=64,BN=128,BK=16,WM=32,WN=64,WNITER=2,TM=8,TN=4,PAD=4"
   --variant "wt_128x128x16=warptile:BM=128,BN=128,BK=16,WM=64,WN=32,WNITER=2,TM=4,TN=4,PAD=4"
   --variant "wt_128x64x16=warptile:BM=128,BN=64,BK=16,WM=64,WN=32,WNITER=1,TM=8,TN=8,PAD=4"
   --variant "vec_bk8_nocap=vectorized:BK=8,max_registers=None")
timeout 120 python results/uidx-2026-11-22/compare_variants.py --shapes 1024 2048 1999x2001x1997 "${W[@]}" --reps 15 \
  --out $OUT/variants-small.json > $OUT/variants-small.log 2>&1; echo "small rc=$?" >> $OUT/variants-small.log
timeout 100 python -m gemmlib verify > $OUT/verify.log 2>&1; echo "verify rc=$?" >> $OUT/verify.log
for f in $OUT/*.log; do tail -n 5 "$f"; done
