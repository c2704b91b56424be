"""gemmlib.distributed on CPU processes (gloo): every algorithm, P = 1..4, uneven shapes.

Starting a process that imports torch costs seconds, so the module starts
four processes once (``gemmlib.distributed.spawn_cpu``) and runs every case
inside them: groups of 1, 2 and 3 processes are sub-groups of the four (every
algorithm takes ``group=``), and SUMMA runs on every grid that factors each
P.  Each rank compares its block of C with a float64 NumPy product of the
same (deterministic) global matrices and reports; the tests below read the
reports.  The local products are NumPy, except in one case that runs
``gemmlib.matmul`` itself in numba's simulator.

The refusal cases pass bad operands on *some* ranks and require every rank to
raise (never a hang): the ranks exchange their shapes first.

On a machine with several GPUs, the ``gpu`` tests run the same checks on CUDA
tensors over NCCL under torchrun (``scripts/distributed_gpu.py check``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():  # pragma: no cover
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

from gemmlib import distributed as gd  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4
#: (M, N, K): uneven everywhere, K = 1, M < P, N < P, K = 0
SHAPES = [(13, 7, 11), (5, 9, 1), (2, 3, 6), (6, 2, 5), (4, 5, 0)]
LOW = {"float16": (torch.float16, 2e-6), "bfloat16": (torch.bfloat16, 2e-6)}
AG_OPTS = [dict(overlap=False), dict(overlap=True, chunks=1), dict(overlap=True, chunks=3),
           dict(transport="copy"), dict(transport="copy", chunks=3), dict(transport="direct")]
RS_OPTS = [dict(overlap=False), dict(overlap=True, chunks=3), dict(transport="copy"),
           dict(transport="direct")]
SUMMA_OPTS = [dict(pipelined=False), dict(pipelined=True), dict(pipelined=True, panel=2),
              dict(pipelined=False, panel=3)]


def grids(P):
    return [(pr, P // pr) for pr in range(1, P + 1) if P % pr == 0]


def _matrices(M, N, K, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * M + 100 * N + K)
    A = (torch.rand(M, K, generator=g) * 2 - 1).to(dtype)
    B = (torch.rand(K, N, generator=g) * 2 - 1).to(dtype)
    return A, B, A.double().numpy() @ B.double().numpy()


def _rel(C, R) -> float:
    if R.size == 0:
        return 0.0
    return float(np.abs(C.double().numpy() - R).max() / max(np.abs(R).max(), 1e-30))


def _shards_1d(A, B, P, r):
    om, on = gd.offsets(gd.split_sizes(A.shape[0], P)), gd.offsets(gd.split_sizes(B.shape[1], P))
    return A[om[r]:om[r + 1]].contiguous(), B[:, on[r]:on[r + 1]].contiguous()


def _blocks_2d(A, B, grid, r):
    pr, pc = grid
    M, K = A.shape
    N = B.shape[1]
    i, j = divmod(r, pc)
    om, on = gd.offsets(gd.split_sizes(M, pr)), gd.offsets(gd.split_sizes(N, pc))
    ka, kb = gd.offsets(gd.split_sizes(K, pc)), gd.offsets(gd.split_sizes(K, pr))
    return (A[om[i]:om[i + 1], ka[j]:ka[j + 1]].contiguous(),
            B[kb[i]:kb[i + 1], on[j]:on[j + 1]].contiguous())


def _sim_product(A, B, out=None):
    """gemmlib.matmul itself, in numba's simulator, on CPU tensors (slow: tiny shapes only)."""
    import gemmlib

    C = torch.as_tensor(np.asarray(gemmlib.matmul(A, B, kernel="coalesced")))
    if out is None:
        return C
    return out.copy_(C)


def _expect_refusal(report, key, fn, exc, match):
    """Run ``fn``; record whether it raised ``exc`` with ``match`` in its message."""
    try:
        fn()
    except exc as e:
        report[key] = (match in str(e), f"{type(e).__name__}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        report[key] = (False, f"raised {type(e).__name__}: {e}, expected {exc.__name__}")
        return
    report[key] = (False, f"did not raise {exc.__name__}")


def _worker(rank, world):
    """Everything, on one of the four processes; returns {case: (passed, detail)}."""
    t0 = time.perf_counter()
    report = {"started": time.time()}
    groups = {P: (None if P == world else dist.new_group(list(range(P))))
              for P in range(1, world + 1)}
    pgrids = {(P, s): gd.ProcessGrid(s, ranks=None if P == world else range(P))
              for P in range(1, world + 1) for s in grids(P)}
    for P in range(1, world + 1):
        if rank >= P:
            continue
        g = groups[P]
        for M, N, K in SHAPES:
            A, B, R = _matrices(M, N, K)
            Al, Bl = _shards_1d(A, B, P, rank)
            for gather in "AB":
                rs, cs = gd.result_slices(M, N, P, rank, gather=gather)
                for opts in AG_OPTS:
                    key = ("allgather", P, (M, N, K), gather, tuple(sorted(opts.items())))
                    C = gd.allgather_matmul(Al, Bl, gather=gather, group=g, **opts)
                    ok = C.dtype == torch.float32 and tuple(C.shape) == R[rs, cs].shape
                    err = _rel(C, R[rs, cs]) if ok else float("inf")
                    report[key] = (ok and err < 1e-6, f"shape {tuple(C.shape)}, error {err:.1e}")
            ok_ = gd.offsets(gd.split_sizes(K, P))
            Ak, Bk = A[:, ok_[rank]:ok_[rank + 1]].contiguous(), B[ok_[rank]:ok_[rank + 1]]
            rs = slice(*gd.offsets(gd.split_sizes(M, P))[rank:rank + 2])
            for opts in RS_OPTS:
                key = ("reduce_scatter", P, (M, N, K), tuple(sorted(opts.items())))
                C = gd.matmul_reduce_scatter(Ak, Bk.contiguous(), group=g, **opts)
                ok = C.dtype == torch.float32 and tuple(C.shape) == R[rs].shape
                err = _rel(C, R[rs]) if ok else float("inf")
                report[key] = (ok and err < 1e-6, f"shape {tuple(C.shape)}, error {err:.1e}")
            for shape in grids(P):
                rs, cs = gd.result_slices(M, N, P, rank, grid=shape)
                Ab, Bb = _blocks_2d(A, B, shape, rank)
                for opts in SUMMA_OPTS:
                    key = ("summa", P, (M, N, K), shape, tuple(sorted(opts.items())))
                    C = gd.summa(Ab, Bb, grid=pgrids[(P, shape)], **opts)
                    ok = tuple(C.shape) == R[rs, cs].shape
                    err = _rel(C, R[rs, cs]) if ok else float("inf")
                    report[key] = (ok and err < 1e-6, f"shape {tuple(C.shape)}, error {err:.1e}")
        # 16-bit inputs: exact products, fp32 sums
        for name, (dt, tol) in LOW.items():
            M, N, K = 13, 7, 11
            A, B, R = _matrices(M, N, K, dt)
            Al, Bl = _shards_1d(A, B, P, rank)
            rs, cs = gd.result_slices(M, N, P, rank, gather="A")
            C = gd.allgather_matmul(Al, Bl, gather="A", overlap=True, group=g)
            report[("dtype", P, name, "allgather")] = (_rel(C, R[rs, cs]) < tol, str(C.dtype))
            shape = grids(P)[-1]
            rs, cs = gd.result_slices(M, N, P, rank, grid=shape)
            C = gd.summa(*_blocks_2d(A, B, shape, rank), grid=pgrids[(P, shape)])
            report[("dtype", P, name, "summa")] = (_rel(C, R[rs, cs]) < tol, str(C.dtype))
        # known sizes: no exchange, same answer
        A, B, R = _matrices(13, 7, 11)
        Al, Bl = _shards_1d(A, B, P, rank)
        rs, cs = gd.result_slices(13, 7, P, rank, gather="B")
        C = gd.allgather_matmul(Al, Bl, gather="B", overlap=True, group=g,
                                sizes=gd.split_sizes(7, P))
        report[("sizes", P, "allgather")] = (_rel(C, R[rs, cs]) < 1e-6, "")
        shape = grids(P)[0]
        C = gd.summa(*_blocks_2d(A, B, shape, rank), grid=pgrids[(P, shape)],
                     sizes=(gd.split_sizes(11, shape[1]), gd.split_sizes(11, shape[0])))
        rs, cs = gd.result_slices(13, 7, P, rank, grid=shape)
        report[("sizes", P, "summa")] = (_rel(C, R[rs, cs]) < 1e-6, "")
    if rank < 2:  # gemmlib.matmul as the local product, in the simulator
        A, B, R = _matrices(4, 3, 5)
        Al, Bl = _shards_1d(A, B, 2, rank)
        rs, cs = gd.result_slices(4, 3, 2, rank, gather="A")
        C = gd.allgather_matmul(Al, Bl, gather="A", overlap=True, chunks=1, group=groups[2],
                                product=_sim_product)
        report[("simulator", "allgather")] = (_rel(C, R[rs, cs]) < 1e-6, "")
    _timeline_cases(rank, world, report)
    _refusals(rank, world, groups, pgrids, report)
    report["deferred"] = _deferred_worker(rank, world)   # last: it patches the all-gather
    report["seconds"] = time.perf_counter() - t0
    return report


def _timeline_cases(rank, world, report):
    A, B, _ = _matrices(64, 48, 40)
    Al, Bl = _shards_1d(A, B, world, rank)
    tl = gd.Timeline(rank)
    gd.allgather_matmul(Al, Bl, gather="A", overlap=False, timeline=tl)
    gd.allgather_matmul(Al, Bl, gather="B", overlap=True, chunks=2, timeline=tl)
    gd.summa(*_blocks_2d(A, B, (2, 2), rank), grid=(2, 2), panel=8, timeline=tl)
    recs = tl.gather()
    kinds = {(r["call"], r["kind"]) for r in recs}
    want = {(c, k) for c in range(3) for k in ("call", "compute", "comm")}
    ranks = {r["rank"] for r in recs}
    sane = all(r["end_ms"] >= r["start_ms"] >= 0 for r in recs)
    report[("timeline", "records")] = (want <= kinds and ranks == set(range(world)) and sane,
                                       f"{sorted(kinds)}, ranks {sorted(ranks)}")
    summ = gd.summarize(recs)
    ok = len(summ) == 3 * world and all(
        s["wall_ms"] > 0 and s["compute_ms"] > 0 and s["comm_ms"] > 0
        and 0 <= s["overlap_ms"] <= min(s["compute_ms"], s["comm_ms"]) + 1e-9 for s in summ)
    report[("timeline", "summary")] = (ok, str(summ[:2]))
    # panels: 2 x 2 grid, K = 40 split 20 + 20 both ways, width 8 -> 3 + 3 panels
    n_panels = len([r for r in recs if r["rank"] == rank and r["call"] == 2
                    and r["kind"] == "comm"])
    report[("timeline", "panels")] = (n_panels == 6, f"{n_panels} broadcast spans")


def _refusals(rank, world, groups, pgrids, report):
    A, B, _ = _matrices(13, 7, 11)
    Al, Bl = _shards_1d(A, B, world, rank)
    ag = gd.allgather_matmul
    def X(key, fn, exc, match):
        _expect_refusal(report, ("refusal", key), fn, exc, match)

    # shapes that disagree across ranks: every rank refuses
    bad_k = torch.zeros(Al.shape[0], 12) if rank == 1 else Al
    X("K differs across ranks", lambda: ag(bad_k, Bl if rank != 1 else torch.zeros(12, Bl.shape[1]),
                                          gather="A"), ValueError, "share K")
    X("dtype differs across ranks", lambda: ag(Al.half() if rank == 2 else Al,
                                               Bl.half() if rank == 2 else Bl, gather="B"),
      TypeError, "float16")
    if rank == 0:
        X("float64 on one rank", lambda: ag(Al.double(), Bl.double(), gather="A"),
          TypeError, "float64")
    else:
        X("float64 on one rank", lambda: ag(Al, Bl, gather="A"), ValueError, "rank 0 refused")
    X("A and B dtypes differ", lambda: ag(Al, Bl.half(), gather="A"), TypeError, "same dtype")
    X("transposed view", lambda: ag(Al, torch.zeros(2, 11).t(), gather="A"),
      ValueError, "contiguous")
    X("A_local's K is not B_local's", lambda: ag(Al, torch.zeros(10, Bl.shape[1]), gather="A"),
      ValueError, "both K")
    X("gather is not A or B", lambda: ag(Al, Bl, gather="C"), ValueError, "gather must be")
    X("chunks without overlap", lambda: ag(Al, Bl, gather="A", chunks=2), ValueError,
      "overlap=True")
    X("ranks pass different gather", lambda: ag(Al, Bl, gather="A" if rank else "B"),
      ValueError, "every rank must pass the same")
    X("a 3-D operand", lambda: ag(Al[None], Bl, gather="A"), ValueError, "2-D")
    X("a NumPy array", lambda: ag(Al.numpy(), Bl, gather="A"), TypeError, "torch tensor")
    X("sizes of the wrong length", lambda: ag(Al, Bl, gather="A", sizes=[1, 2]), ValueError,
      "sizes=")
    # SUMMA
    Ab, Bb = _blocks_2d(A, B, (2, 2), rank)
    X("grid does not fit P", lambda: gd.summa(Ab, Bb, grid=(3, 1)), ValueError, "does not fit")
    X("ranks pass different grids", lambda: gd.summa(Ab, Bb, grid=(2, 2) if rank else (1, 4)),
      ValueError, "every rank must pass the same")
    X("rows differ along a grid row",
      lambda: gd.summa(torch.zeros(Ab.shape[0] + 1, Ab.shape[1]) if rank == 1 else Ab, Bb,
                       grid=(2, 2)), ValueError, "must share A's rows")
    X("K covered differently by A and B",
      lambda: gd.summa(torch.zeros(Ab.shape[0], Ab.shape[1] + 1) if rank % 2 else Ab, Bb,
                       grid=(2, 2)), ValueError, "cover K")
    X("panel width 0", lambda: gd.summa(Ab, Bb, grid=(2, 2), panel=0), ValueError, "panel")
    if rank < 2:
        X("a tuple grid on a sub-group", lambda: gd.summa(*_blocks_2d(A, B, (1, 2), rank),
                                                          grid=(1, 2), group=groups[2]),
          ValueError, "ProcessGrid")
    # after all that, the group still works
    C = ag(Al, Bl, gather="A")
    report[("refusal", "the group still works")] = (C.shape == (13, Bl.shape[1]), "")


# --------------------------------------------------------------------------
# The tests: one spawn, many reports


@pytest.fixture(scope="module")
def reports():
    t, wall = time.perf_counter(), time.time()
    out = gd.spawn_cpu(_worker, WORLD, timeout=300)
    print(f"\n[test_distributed] {WORLD} gloo processes: {time.perf_counter() - t:.1f} s in all, "
          f"of which starting them (importing torch and gemmlib) "
          f"{max(r['started'] for r in out) - wall:.1f} s and the cases "
          f"{max(r['seconds'] for r in out):.1f} s")
    return out


def _failures(reports, select):
    bad, n = [], 0
    for rank, rep in enumerate(reports):
        for key, val in rep.items():
            if key in ("seconds", "started", "deferred") or not select(key):
                continue
            n += 1
            ok, detail = val
            if not ok:
                bad.append(f"rank {rank} {key}: {detail}")
    return n, bad


@pytest.mark.parametrize("P", range(1, WORLD + 1))
def test_allgather_matmul(reports, P):
    n, bad = _failures(reports, lambda k: k[0] == "allgather" and k[1] == P)
    assert n == P * len(SHAPES) * 2 * len(AG_OPTS) and not bad, "\n".join(bad)


@pytest.mark.parametrize("P", range(1, WORLD + 1))
def test_matmul_reduce_scatter(reports, P):
    n, bad = _failures(reports, lambda k: k[0] == "reduce_scatter" and k[1] == P)
    assert n == P * len(SHAPES) * len(RS_OPTS) and not bad, "\n".join(bad)


def _deferred_worker(rank, world):
    """Collectives that run late, as NCCL's do on their own stream: the fake all-gather
    holds only a weak reference to what it sends and reads it when waited on.  A staging
    buffer the caller let go of before then is reported (on a GPU, the caching allocator
    would already have handed its memory to the next piece: the wrong product seen on 4 GPUs
    at three chunks)."""
    import weakref

    from gemmlib.distributed import allgather as ag

    lost, real = [], ag._all_gather_flat

    class Late:
        def __init__(self, out, inp, group):
            self.out, self.inp, self.group = out, weakref.ref(inp), group

        def wait(self):
            inp = self.inp()
            if inp is None:
                lost.append(self.out.numel())
                inp = torch.full((self.out.numel() // world,), float("nan"), dtype=self.out.dtype)
            real(self.out, inp, self.group)
            return True

    ag._all_gather_flat = lambda out, inp, group, async_op=False: (
        Late(out, inp, group) if async_op else real(out, inp, group))
    report = {}
    try:
        for M, N, K in ((1000, 777, 13), (13, 7, 11), (9, 30, 5)):
            A, B, R = _matrices(M, N, K)
            Al, Bl = _shards_1d(A, B, world, rank)
            for gather in "AB":
                for chunks in (2, 3, 4):
                    rs, cs = gd.result_slices(M, N, world, rank, gather=gather)
                    C = gd.allgather_matmul(Al, Bl, gather=gather, overlap=True, chunks=chunks)
                    report[(M, N, K, gather, chunks)] = (not lost and _rel(C, R[rs, cs]) < 1e-6,
                                                         f"{len(lost)} sends freed early")
                    lost.clear()
    finally:
        ag._all_gather_flat = real
    return report


def test_staging_buffers_outlive_their_collectives(reports):
    deferred = [rep["deferred"] for rep in reports]
    bad = [f"rank {r} {k}: {v[1]}" for r, rep in enumerate(deferred) for k, v in rep.items()
           if not v[0]]
    assert len(deferred[0]) == 18 and not bad, "\n".join(bad)


@pytest.mark.parametrize("P", range(1, WORLD + 1))
def test_summa_on_every_grid(reports, P):
    n, bad = _failures(reports, lambda k: k[0] == "summa" and k[1] == P)
    assert n == P * len(SHAPES) * len(grids(P)) * len(SUMMA_OPTS) and not bad, "\n".join(bad)


def test_sixteen_bit_inputs_and_known_sizes(reports):
    n, bad = _failures(reports, lambda k: k[0] in ("dtype", "sizes"))
    assert n == sum(P * (2 * len(LOW) + 2) for P in range(1, WORLD + 1)) and not bad, \
        "\n".join(bad)


def test_gemmlib_matmul_as_the_local_product(reports):
    n, bad = _failures(reports, lambda k: k[0] == "simulator")
    assert n == 2 and not bad, "\n".join(bad)


def test_timeline(reports):
    n, bad = _failures(reports, lambda k: k[0] == "timeline")
    assert n == 3 * WORLD and not bad, "\n".join(bad)


def test_refusals_are_raised_on_every_rank(reports):
    n, bad = _failures(reports, lambda k: k[0] == "refusal")
    assert n >= 18 * WORLD and not bad, "\n".join(bad)


# --------------------------------------------------------------------------
# Pure helpers, no processes


def test_split_sizes_and_offsets():
    assert gd.split_sizes(13, 3) == [5, 4, 4] and gd.split_sizes(2, 4) == [1, 1, 0, 0]
    assert gd.offsets([5, 4, 4]) == [0, 5, 9, 13]
    with pytest.raises(ValueError):
        gd.split_sizes(3, 0)


def test_grid_shape_is_the_squarest():
    assert [gd.grid_shape(P) for P in (1, 2, 3, 4, 6, 7, 8, 12)] == [
        (1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (1, 7), (2, 4), (3, 4)]


def test_panels_never_cross_an_owner():
    for ka, kb, w in [([3, 4], [2, 5], None), ([7], [7], 3), ([0, 5], [5, 0], 2),
                      ([4, 4, 3], [6, 5], 2)]:
        ps = gd.panels(ka, kb, w)
        oa, ob = gd.offsets(ka), gd.offsets(kb)
        assert ps[0][0] == 0 and ps[-1][1] == sum(ka)
        assert all(p[1] == q[0] for p, q in zip(ps, ps[1:]))
        for k0, k1, ja, ib in ps:
            assert oa[ja] <= k0 < k1 <= oa[ja + 1] and ob[ib] <= k0 < k1 <= ob[ib + 1]
            assert w is None or k1 - k0 <= w
    with pytest.raises(ValueError, match="same K"):
        gd.panels([3], [4])


def test_summarize_counts_overlap_once():
    recs = [dict(rank=0, call=0, kind="call", label="x", start_ms=0, end_ms=10),
            dict(rank=0, call=0, kind="comm", label="", start_ms=0, end_ms=4),
            dict(rank=0, call=0, kind="comm", label="", start_ms=3, end_ms=6),
            dict(rank=0, call=0, kind="compute", label="", start_ms=2, end_ms=9)]
    s = gd.summarize(recs)[0]
    assert (s["wall_ms"], s["comm_ms"], s["compute_ms"], s["overlap_ms"]) == (10, 6, 7, 4)
    assert s["hidden"] == pytest.approx(4 / 6)


def test_uninitialised_torch_distributed_is_named():
    if dist.is_initialized():  # pragma: no cover
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        gd.allgather_matmul(torch.zeros(2, 2), torch.zeros(2, 2), gather="A")


def test_spawn_cpu_reports_a_failing_rank():
    with pytest.raises(RuntimeError, match="rank 1 failed: ZeroDivisionError"):
        gd.spawn_cpu(_fails_on_rank_1, 2, timeout=120)


def _fails_on_rank_1(rank, world):
    if rank == 1:
        return 1 / 0
    dist.barrier()  # rank 0 waits for a partner that never comes: spawn_cpu stops it
    return rank


# --------------------------------------------------------------------------
# The course's paper model and figures (gemmcourse.viz_distributed)


def test_paper_model_bytes_and_flops():
    from gemmcourse import viz_distributed as vd

    n, P = 16384, 4
    assert vd.comm_bytes("gather_A", n, 2 * n, n, P, 2) == 0.75 * n * n * 2
    assert vd.comm_bytes("gather_B", 2 * n, n, n, P, 2) == 0.75 * n * n * 2
    assert vd.comm_bytes("summa", n, n, n, P, 2, grid=(2, 2)) == n * n  # two half-strips
    # a 1 x P grid is the 1-D algorithm that gathers A
    assert vd.comm_bytes("summa", 300, 500, 700, 5, 4, grid=(1, 5)) == pytest.approx(
        vd.comm_bytes("gather_A", 300, 500, 700, 5, 4))
    assert vd.flops_per_gpu(8, 8, 8, 4) == 256
    assert vd.bytes_per_flop("gather_A", n, n, n, P, 2) == pytest.approx(3 * 2 / (2 * n))
    assert vd.winner(1024, 65536, 8192, 8) == "gather_A"
    assert vd.winner(65536, 1024, 8192, 8) == "gather_B"
    assert vd.winner(16384, 16384, 16384, 16) == "summa"
    t = vd.model_times("gather_A", 8192, 8192 * 4, 8192, 4, tflops=600, busbw_gbs=360)
    assert t["overlapped_s"] == max(t["compute_s"], t["comm_s"])
    assert t["efficiency_overlapped"] == 1.0 > t["efficiency_serial"]
    assert vd.grid_shape(12) == gd.grid_shape(12)


def test_pipeline_time():
    from gemmcourse import viz_distributed as vd

    assert vd.pipeline_time([2, 2, 2], [3, 2, 2, 2], [None, 0, 1, 2]) == 9
    assert vd.pipeline_time([1.5] * 4, [2] + [2.5] * 4, [None, 0, 1, 2, 3]) == 12
    assert vd.pipeline_time([5, 5], [1, 1, 1], [None, 0, 1]) == 11   # comm-bound
    assert vd.pipeline_time([4], [1, 1], [0, 0]) == 6                # no overlap at all


def _fake_records():
    out = []
    for rank in range(2):
        for call, label in enumerate(["allgather_matmul gather=A overlap=False",
                                      "allgather_matmul gather=A overlap=True chunks=2"]):
            t = 10.0 * call
            out += [dict(rank=rank, call=call, kind="call", label=label, start_ms=t,
                         end_ms=t + 5),
                    dict(rank=rank, call=call, kind="comm", label="g", start_ms=t, end_ms=t + 2),
                    dict(rank=rank, call=call, kind="compute", label="p", start_ms=t + 1,
                         end_ms=t + 5)]
    return out


def test_figures_draw(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gemmcourse import viz_distributed as vd

    assert vd.short_label("allgather_matmul gather=B overlap=True chunks=3") == \
        "gather B, overlap, 3 chunk(s)"
    assert vd.short_label("summa 2x2 pipelined=False") == "SUMMA 2x2, not pipelined"
    for fig in (vd.plot_timeline(_fake_records(), title="t"), vd.plot_ratio(4096, Ps=(2, 4)),
                vd.plot_model_efficiency(P=2, sizes=[1024, 4096]), vd.plot_winner_map(P=4)):
        fig.savefig(tmp_path / "f.png")
        plt.close(fig)
    assert len(vd.ratio_table(1024, 1024, 1024, Ps=(2,))) == 3


def test_results_reader(tmp_path, capsys):
    import json

    import matplotlib

    matplotlib.use("Agg")
    from gemmcourse import viz_distributed as vd

    assert vd.show_distributed_results(tmp_path) == 0
    assert "No multi-GPU measurement" in capsys.readouterr().out
    row = dict(dtype="fp16", scaling="weak", algorithm="gather_A", engine="gemmlib", M=8, N=16,
               K=8, P=2, grid=None, options={"overlap": True, "chunks": 2}, median_ms=1.0,
               min_ms=1.0, max_ms=1.0, reps=3, tflops=1.0, efficiency=0.95,
               timeline=dict(wall_ms=1, compute_ms=0.9, comm_ms=0.3, overlap_ms=0.25,
                             hidden=0.8))
    data = dict(meta=dict(device="gpu", gpu="NVIDIA H200", processes=2, date="2026-11-24"),
                allgather_bandwidth=[dict(bytes=2**30, time_ms=3.0, algbw_gbs=358.0,
                                          busbw_gbs=179.0)],
                rows=[row], targets=[dict(what="x", met=True)],
                timelines={"fp16 weak gather_A": _fake_records()})
    (tmp_path / "distributed-nvidia-h200-x2-2026-11-24.json").write_text(json.dumps(data))
    cpu = dict(data, meta=dict(data["meta"], device="cpu"))
    (tmp_path / "distributed-cpu-x2-2026-11-24.json").write_text(json.dumps(cpu))
    assert [n for n, _ in vd.distributed_files(tmp_path)] == [
        "distributed-nvidia-h200-x2-2026-11-24.json"]
    assert vd.show_distributed_results(tmp_path) == 1
    assert vd.scaling_rows(data)[0][7] == "95.0%"


def test_measurement_script_runs_on_cpu_processes(tmp_path):
    """scripts/distributed_gpu.py's code paths (timing, timelines, the JSON, the targets) on
    two gloo processes with tiny sizes: not a measurement, a check that the GPU run can work."""
    import json

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(ROOT / "scripts" / "distributed_gpu.py"), "bench", "--cpu", "--dtypes", "bf16",
           "--reps", "1", "--chunks", "2", "--weak", "16", "--strong", "24", "--out",
           str(tmp_path)]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (path,) = tmp_path.glob("distributed-cpu-x2-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["device"] == "cpu" and data["allgather_bandwidth"]
    assert not [r for r in data["rows"] if "error" in r]
    algs = {(r["algorithm"], r["engine"]) for r in data["rows"]}
    assert {("gather_A", "gemmlib"), ("gather_B", "torch plain"), ("summa", "torch")} <= algs
    assert data["targets"] and data["timelines"]


# --------------------------------------------------------------------------
# GPUs: the same checks over NCCL, under torchrun


@pytest.mark.gpu
def test_on_several_gpus_under_torchrun():
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 2:
        pytest.skip(f"needs 2 or more GPUs (this machine has {n})")
    torchrun = shutil.which("torchrun") or None
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", f"--nproc-per-node={min(n, 4)}",
        str(ROOT / "scripts" / "distributed_gpu.py"), "check"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NUMBA_ENABLE_CUDASIM="0")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-5000:]
    assert "all checks passed" in out.stdout
