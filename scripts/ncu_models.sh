#!/usr/bin/env bash
# Nsight Compute on the shapes behind issue 18's missed targets (scripts/ncu_models.py).
#   bash scripts/ncu_models.sh     (on the GPU machine; logs and the CSV go to $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-run-logs}; mkdir -p "$OUT"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SECTIONS="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
METRICS="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum"
# a small trial first: if the metric list is refused, profile with the sections alone
if ! ncu --clock-control none $SECTIONS $METRICS -c 1 python3 -c \
     "import torch; a=torch.rand(256,256,device='cuda'); (a@a).sum().item()" > "$OUT/ncu-trial.txt" 2>&1; then
  echo "metric list refused; sections only"; tail -5 "$OUT/ncu-trial.txt"; METRICS=""
fi
python3 scripts/ncu_models.py warm "$OUT/ncu-cases.json" 2>&1 | tee "$OUT/ncu-warm.log"
ncu --clock-control none --profile-from-start off --csv --page details $SECTIONS $METRICS \
    python3 scripts/ncu_models.py profile > "$OUT/ncu-models.csv" 2> "$OUT/ncu-models.err"
echo "ncu exit $?"; tail -3 "$OUT/ncu-models.err"
python3 scripts/ncu_models.py summarize "$OUT/ncu-models.csv" "$OUT/ncu-cases.json" | tee "$OUT/ncu-models.md"
