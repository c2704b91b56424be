#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck, synccheck and initcheck on every Hopper rung:
# wgmma_async, wgmma_tma, wgmma_ws, wgmma_split_k (fp16 and bf16), wgmma_tf32, wgmma_fp8
# (e4m3 and e5m2 with bf16 output and B as (N, K); e4m3 with fp32 output and B as (K, N)),
# and any later sm_90 rung of the ladder (wgmma_cluster, wgmma_pingpong: fp16 and bf16),
# i.e. scripts/sanitize.py --kernels hopper.  On an H100/H200, from anywhere:
#
#     bash scripts/sanitize_hopper.sh [extra scripts/sanitize.py options]
#
# $OUT/sanitize-hopper (default ./sanitize-logs/sanitize-hopper) gets four files:
# sanitize.json (every run: tool, kernel, errors, warnings, results, first findings; the
# tool's version and options), console.log (the progress lines and the table),
# environment.txt (tool version, GPU, driver) and logs.tgz (runs/TOOL-KERNEL.log, one per
# tool and kernel, warm-KERNEL.log for the runs without a sanitizer) -- few files, as
# the GPU machine hands back at most eight.
# Exit status: 0 when every run is clean and every result right.
#
# Shapes (scripts/sanitize_target.py): 67x45x37 (odd: matmul stages zero-padded copies
# with 16-byte rows, edge tiles everywhere), tile+ (one past the block tile: a second tile
# in M and N, 3 k-tiles) and 300x520x528@4/3 (3 x 3 tiles of 128 x 256, 3 x 5 for the
# 128 x 128 tiles of wgmma_async and wgmma_pingpong; 9 k-tiles of 64,
# 5 of 128 for FP8, 17 of 32 for tf32 -- more than STAGES, so the ring refills; K a
# multiple of 16, so no staging copy, and the FP8 KN form takes B as (K, N) through its
# transpose pre-pass; the persistent rungs run with at most 4 blocks, so each block
# walks several tiles and its mbarrier ring wraps across tiles; wgmma_split_k cuts K
# into 3 slices, 27 units over 4 blocks, with the in-kernel ticket sums).  Filling all
# 132 SMs with more than one tile each would take a problem far too slow under the tools.
#
# Time: with a warm kernel cache ($GEMMLIB_CACHE, shared with scripts/hopper_gpu.sh) the
# warm-up (every kernel once, no sanitizer, in parallel) takes ~20 s and the 64 sanitizer
# runs (16 kernels x 4 tools), 12 at a time, a few minutes; --deadline 400 starts no run
# after 400 s (those are reported "not run", a problem) and caps the time a started run
# may take, so the whole thing ends within ~7 minutes, cold cache or not.
#
# What these tools do not model for these kernels -- a clean run proves less than it seems.
# Sources: the Compute Sanitizer user manual, https://docs.nvidia.com/compute-sanitizer/
# ComputeSanitizer/index.html (sections cited), unless noted.
#  * racecheck sees shared memory only ("Currently, this tool only supports detecting
#    accesses to on-chip shared memory", What is Racecheck?).  No tool checks races in
#    global memory: wgmma_split_k's partial sums and tickets (threadfence + atomic ticket,
#    the last slice adds) are checked only by the results.
#  * racecheck's asynchronous-copy checks are documented for cuda::memcpy_async and PTX
#    cp.async tracked by a pipeline / async-group and its commit/wait ("Racecheck support
#    for asynchronous copy").  The manual describes no hazard checks for TMA
#    (cp.async.bulk.tensor) writes whose completion an mbarrier's complete_tx signals;
#    "asynchronous bulk copy" appears only among the operations --racecheck-trace-sync
#    logs.  So a consumer reading a stage before its bytes land is not a documented
#    racecheck finding.
#  * wgmma reads its A and B tiles from shared memory through matrix descriptors.  The
#    manual documents wgmma support for memcheck and synccheck only (--check-warpgroup-mma:
#    "Enables memcheck and synccheck support for PTX wgmma"; synccheck checks that the warps
#    of a warpgroup issue the same wgmma sequence, "Synccheck support for wgmma"), nothing
#    for racecheck: the producer refilling a stage that a wgmma still reads (what the
#    "empty" mbarriers and wgmma.wait_group prevent) is not a documented racecheck finding.
#    The right results at 300x520x528@4 (ring wrapping across tiles) are the evidence there.
#  * racecheck and synccheck model cuda::barrier synchronisation on Ampere and newer, with
#    the number of barriers per block taken from compiler information, which may
#    undercount ("Racecheck support for cuda::barrier"); sanitize.py passes
#    --num-cuda-barriers 16 (a ring has 2 x STAGES <= 16 mbarriers) and counts the
#    overflow warning as an error.  These kernels use raw PTX mbarriers (init, arrive,
#    expect_tx, try_wait.parity) from numba, not the C++ cuda::barrier; the manual does
#    not say how far those are modelled, nor that wrong phase parities or expect_tx byte
#    counts are detected.  Synccheck's documented classes: divergent threads at a barrier,
#    invalid barrier arguments, cuda::barrier use, wgmma sequence errors.  A wrong parity
#    or byte count shows here as a hang (--timeout) or a wrong result.
#  * memcheck checks accesses against allocation bounds ("Memory access error").  In shared
#    memory the allocation is the whole dynamic block (ring + barriers), so a read or write
#    from one stage into another is not an error.  In global memory, allocations may lie
#    back to back and "an overflow access into the first buffer will simply happen in the
#    second buffer and not be detected" ("Padding"): sanitize_target.py turns CuPy's pool
#    off (one cudaMalloc per array) and sanitize.py passes --padding 65536.  TMA copies
#    are covered by --check-bulk-copy ("Enables checks related to the PTX cp.async.bulk
#    instructions on Hopper"); the manual does not say what those checks are.  Older tools
#    misreported wgmma's shared-memory A-operand size as out of bounds
#    (github.com/NVIDIA/compute-sanitizer-samples/issues/19, 2023, closed): check the
#    version (sanitize.json: sanitizer_version) before believing such a report.
#  * initcheck checks global memory by default ("Initcheck Address Space Selection"; shared
#    memory only with --initcheck-address-space shared|all, not used here), memory counting
#    as initialised after device writes, memcpy or memset ("What is Initcheck?").  The
#    manual does not say whether TMA writes into shared memory count as initialisation.
#    --check-api-memory-access (default yes) extends it to cudaMemcpy/cudaMemset, which is
#    how C comes back to the host; an element no kernel wrote also makes the result WRONG
#    unless its garbage happens to be close to the right value.
#  * Clusters / distributed shared memory: racecheck reports remote shared-memory accesses
#    made before the target block entered or after it exited without cluster-wide
#    synchronisation ("Racecheck cluster entry and exit race detection").  Only
#    wgmma_cluster launches clusters (of 2: TMA multicast of B into both blocks, remote
#    mbarrier arrivals through mapa, cluster barriers at both ends); the others run as
#    clusters of one block (their TMA destination .shared::cluster is their own shared
#    memory).  The manual describes no checks of multicast TMA writes into a peer's
#    shared memory or of remote arrivals beyond that entry/exit check.  wgmma_cluster is
#    not grid-capped (its loop steps by clusters), so @4 does not apply to it.
#  * TMA stores (wgmma_store: cp.async.bulk.tensor from shared memory to C, tracked in bulk
#    groups): the manual describes no racecheck model of the copy engine reading the stage
#    (the consumers restage it after the storer's wait_group.read and its epi_empty arrival),
#    and does not say whether initcheck counts the bytes a TMA store writes as initialised.
#    It does not: on the H100 (results/epilogue-2026-11-26/, sanitize-*logs-h100*.tgz)
#    initcheck reports 56575 (float32 C) / 46825 (16-bit C, auto's build) uninitialised
#    global reads per precision, every result right, and every printed one is in CuPy's copy
#    kernel (cupy_copy_*, gemmlib/api.py's copy of a padded C into the caller's array)
#    reading bytes the TMA store wrote; none is in a gemmlib kernel.
set -uo pipefail
cd "$(dirname "$0")/.."
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-LAZY}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export GEMMLIB_CACHE=${GEMMLIB_CACHE:-/tmp/gcache}
DEST=${OUT:-$PWD/sanitize-logs}/sanitize-hopper
mkdir -p "$DEST"
PY=${PY:-python3}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
if [ -z "$SAN" ]; then
  newest=$(ls -d /usr/local/cuda-*/bin/compute-sanitizer 2>/dev/null | sort -V -r)
  for c in /usr/local/cuda/bin/compute-sanitizer $newest; do
    [ -x "$c" ] && SAN=$c && break
  done
fi
if [ -z "$SAN" ]; then
  echo "compute-sanitizer not found (PATH, /usr/local/cuda/bin); set COMPUTE_SANITIZER" >&2
  exit 1
fi
{
  echo "== $(date -u +%FT%TZ) $SAN"
  "$SAN" --version 2>&1 | tail -n 2
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} | tee "$DEST/environment.txt"
rm -rf "$DEST/runs"
"$PY" scripts/sanitize.py --kernels hopper --sanitizer "$SAN" --out "$DEST/runs" --warm \
  --jobs "${JOBS:-12}" --timeout "${TIMEOUT:-240}" --deadline "${DEADLINE:-400}" "$@" \
  2>&1 | tee "$DEST/console.log"
status=${PIPESTATUS[0]}
cp "$DEST/runs/sanitize.json" "$DEST/" 2>/dev/null
tar czf "$DEST/logs.tgz" -C "$DEST" runs && rm -rf "$DEST/runs"
exit "$status"
