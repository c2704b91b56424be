#!/usr/bin/env bash
# GPU runs of the distributed GEMMs: on a machine with several GPUs, for P = 2, 4, 8 (those
# the machine has), the correctness check, the GPU tests, and the measurement
# (scripts/distributed_gpu.py; results/distributed-<gpu>-x<P>-<date>.json).
# Logs go to $OUT/logs (default /tmp/dist-out), new result files into $OUT/results.tar.
#   bash scripts/distributed_gpu.sh                  # every stage, every P
#   PS="2 4" bash scripts/distributed_gpu.sh check bench block
#   QUICK=1 bash scripts/distributed_gpu.sh bench    # fewer sizes and repetitions
# NVLink multicast stays off: these machines require it (a program that uses it can take the
# host's GPUs out of service).
set -uo pipefail
cd "$(dirname "$0")/.."
source .whl/env.sh >/dev/null 2>&1 || true
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD:${PYTHONPATH:-} GEMMLIB_CACHE=${GEMMLIB_CACHE:-/tmp/gcache}
export PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
OUT=${OUT:-/tmp/dist-out}
mkdir -p "$OUT/logs" "$GEMMLIB_CACHE/kernels"
touch /tmp/dist-marker
T0=$SECONDS
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
PS=${PS:-"2 4 8"}
STAGES=${*:-check pytest bench}
echo "GPUs: $NGPU; P in: $PS; stages: $STAGES"
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -20
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())'
save() { find results -newer /tmp/dist-marker -type f | tar cf "$OUT/results.tar" -T - 2>/dev/null; }
stage() {
  local name=$1 t=$2; shift 2
  local s=$SECONDS
  echo "=== $name (limit $t s, at $((SECONDS - T0)) s)"
  timeout "$t" "$@" > "$OUT/logs/$name.log" 2>&1
  echo "=== $name rc=$? after $((SECONDS - s)) s"
  grep -v -i "warn" "$OUT/logs/$name.log" | tail -n "${TAILN:-30}"
  save
}
# torchrun with P processes, one per GPU (a command, not a shell function: timeout runs it)
torchrun_p() { echo python3 -m torch.distributed.run --standalone --nproc-per-node="$1" scripts/distributed_gpu.py; }
for st in $STAGES; do
  for p in $PS; do
    if (( p > NGPU )); then echo "=== skip P=$p: only $NGPU GPUs"; continue; fi
    case $st in
      check) TAILN=20 stage "check-x$p" "${T_CHECK:-600}" $(torchrun_p "$p") check ;;
      bench) TAILN=120 stage "bench-x$p" "${T_BENCH:-900}" $(torchrun_p "$p") bench ${QUICK:+--quick} ${BENCH_ARGS:-} ;;
      block) TAILN=40 stage "block-x$p" "${T_BLOCK:-600}" $(torchrun_p "$p") block ${QUICK:+--quick} ;;
      pytest) ;;  # below, once
      *) echo "unknown stage $st" ;;
    esac
  done
  if [[ $st == pytest ]] && (( NGPU >= 2 )); then
    TAILN=20 stage pytest "${T_PYTEST:-900}" python3 -m pytest -q -rfE -m gpu -p no:cacheprovider tests/test_distributed.py
  fi
done
echo "total $((SECONDS - T0)) s"
