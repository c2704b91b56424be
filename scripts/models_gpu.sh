#!/usr/bin/env bash
# Issue 18 on a GPU machine: framework tests, host cost against torch/CuPy, the models suite.
#   bash scripts/models_gpu.sh [stage ...]
# stages: test host models nonfinite skinny profile, ncu (scripts/ncu_models.sh: Nsight Compute
# on the shapes behind missed targets, beside cuBLAS), splitk (the split-K rung's GPU tests),
# tc-shapes (scripts/tc_shapes_gpu.py: the candidates per shape behind dispatch.select_hopper), gpu-tests-1 / gpu-tests-2 (the whole GPU
# suite, `pytest -m gpu`, in two halves that each fit a 10-minute call), notebooks (every
# chapter executed in place; the stored notebooks come back as notebooks-<n>.tar.gz)
# Logs and result files go to $OUT (the device tool's folder) or gpu-run-logs/.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-run-logs}; mkdir -p "$OUT"
PY=${PY:-python3}
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1
stages=("$@"); [[ ${#stages[@]} -eq 0 ]] && stages=(test host models)
for st in "${stages[@]}"; do
  echo "=== $st $(date -u +%H:%M:%S)"
  case $st in
    test)   $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_frameworks.py tests/test_inputs.py \
              tests/test_models_suite.py 2>&1 | tee "$OUT/pytest-frameworks.log" | tail -15 ;;
    host)   $PY -m gemmlib bench --host-cost --out "$OUT" 2>&1 | tee "$OUT/host-cost.log" ;;
    models) $PY -m gemmlib bench --suite models --inputs ${INPUTS:-torch} \
              ${PRECISIONS:+--precisions $PRECISIONS} ${TOKENS:+--tokens $TOKENS} --out "$OUT" 2>&1 \
              | tee "$OUT/models.log" ;;
    splitk) $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_wgmma_split_k.py \
              tests/test_mma_split_k.py tests/test_kernels.py tests/test_hopper.py \
              tests/test_tensor_cores.py -k "split_k or hopper or auto" 2>&1 \
              | tee "$OUT/pytest-splitk.log" | tail -15 ;;
    tc-shapes) $PY scripts/tc_shapes_gpu.py "$OUT/tc-shapes.json" ${PRECISIONS:+--precisions $PRECISIONS} \
              ${MS:+--ms $MS} ${BUDGET:+--budget $BUDGET} 2>&1 | tee "$OUT/tc-shapes.log" ;;
    nonfinite) $PY scripts/nonfinite_gpu.py "$OUT/nonfinite.json" 2>&1 | tee "$OUT/nonfinite.log" ;;
    skinny) $PY scripts/skinny_gpu.py "$OUT/skinny.json" 2>&1 | tee "$OUT/skinny.log" ;;
    ncu)    bash scripts/ncu_models.sh 2>&1 | tee "$OUT/ncu.log" | tail -60 ;;
    profile) $PY scripts/host_profile.py "$OUT/host-profile.json" 2>&1 | tee "$OUT/host-profile.log" ;;
    gpu-tests-1|gpu-tests-2)
            files=(tests/test_*.py); half=$(( ${#files[@]} / 2 ))
            if [[ $st == gpu-tests-1 ]]; then part=("${files[@]:0:$half}"); else part=("${files[@]:$half}"); fi
            $PY -m pytest -q -m gpu -p no:cacheprovider "${part[@]}" 2>&1 | tee "$OUT/$st.log" | tail -25 ;;
    notebooks)
            $PY scripts/execute_notebooks.py ${NOTEBOOKS:-} 2>&1 | tee "$OUT/notebooks.log" | tail -40
            tar czf "$OUT/notebooks-1.tar.gz" chapters/0*.ipynb chapters/10-*.ipynb
            tar czf "$OUT/notebooks-2.tar.gz" chapters/1[1-9]-*.ipynb chapters/leaderboard.ipynb
            ls -la "$OUT"/notebooks-*.tar.gz ;;
    *) echo "unknown stage $st" ;;
  esac
done
