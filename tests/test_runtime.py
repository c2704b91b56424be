"""gemmlib.runtime and the tensor maps' slots, without a GPU: the store kernel's PTX
assembles, slots never overlap, a captured call's maps and buffers are the graph's own
(CuPy's memory: never reused, never freed; torch's: the graph's temporaries), and
importing the torch front end leaves CuPy out."""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from gemmlib import tma
from gemmlib.runtime import launch, maps, memory


class _FakeBuffer:
    def __init__(self, base, nbytes):
        self.ptr, self.nbytes = base, nbytes


@pytest.fixture
def fake_device(monkeypatch):
    """Allocations from a counter and stores recorded, instead of a GPU."""
    state = {"next": 1 << 20, "stores": []}

    def allocate(nbytes, stream, zero=False):
        buf = _FakeBuffer(state["next"], nbytes)
        state["next"] += nbytes + 4096
        return buf

    monkeypatch.setattr(memory, "allocate", allocate)
    monkeypatch.setattr(memory, "synchronize", lambda: None)
    monkeypatch.setattr(maps, "_store", lambda addr, raw, stream:
                        state["stores"].append((addr, raw.nbytes, stream)))
    state["encodes"] = 0

    def encode(ptr, *rest):
        state["encodes"] += 1
        return np.full(16, ptr, np.uint64)

    def readdressed(raw, ptr):
        raw[:] = ptr
        return True

    monkeypatch.setattr(tma, "encode_2d", encode)
    monkeypatch.setattr(maps, "_readdressed", readdressed)
    monkeypatch.setattr(maps, "_ENCODED", {})
    monkeypatch.setattr(maps, "_WHOLE", {})
    monkeypatch.setattr(maps, "_KEPT", {})
    monkeypatch.setattr(maps, "_GRAPH_KEPT", {})
    monkeypatch.setattr(maps, "_EAGER_SLOTS", maps._Slots())
    monkeypatch.setattr(maps, "_GRAPH_SLOTS", maps._Slots())
    return state


def _op(ptr):
    return (ptr, (64, 64), 128, "float16", (64, 64), 128)


def test_the_store_kernel_assembles():
    ptxas = shutil.which("ptxas") or "/usr/local/cuda/bin/ptxas"
    if not shutil.which(ptxas):
        pytest.skip("no ptxas here")
    import tempfile, os

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "s.ptx")
        with open(src, "wb") as f:
            f.write(maps._store_ptx().rstrip(b"\0"))
        for arch in ("sm_75", "sm_90"):
            r = subprocess.run([ptxas, f"-arch={arch}", src, "-o", os.path.join(d, "s.cubin")],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr


def test_eager_maps_are_kept_and_reused(fake_device):
    a = maps.operand_maps((_op(1 << 30), _op(2 << 30)), stream=7)
    assert maps.operand_maps((_op(1 << 30), _op(2 << 30)), stream=7) == a
    assert len(fake_device["stores"]) == 1   # written once, then found
    b = maps.operand_maps((_op(3 << 30), _op(2 << 30)), stream=7)
    assert abs(b - a) >= maps.SLOT_BYTES


def test_a_new_address_reuses_the_encoding(fake_device):
    """An activation at a new address (a model's next layer) is not encoded again: the
    kept encoding of its shape gets the address; another shape is encoded."""
    maps.operand_maps((_op(1 << 30), _op(2 << 30)), stream=7)
    assert fake_device["encodes"] == 1            # A and B alike but for the address
    raw = maps._encoded((_op(5 << 30),), ())
    assert fake_device["encodes"] == 1 and int(raw[0]) == 5 << 30
    maps._encoded(((6 << 30, (64, 32), 64, "float16", (64, 32), 64),), ())
    assert fake_device["encodes"] == 2


def test_slots_never_overlap_across_slabs(fake_device):
    slots = maps._Slots()
    got = [slots.take(0) for _ in range(3 * maps._SLAB_SLOTS + 5)]
    assert len(set(got)) == len(got)
    got.sort()
    assert all(b - a >= maps.SLOT_BYTES for a, b in zip(got, got[1:]))


def test_captured_maps_are_the_graphs_own(fake_device, monkeypatch):
    ops = (_op(1 << 30), _op(2 << 30))
    eager = maps.operand_maps(ops, stream=7)
    g1 = maps.operand_maps(ops, stream=9, graph=True)
    g2 = maps.operand_maps(ops, stream=9, graph=True)
    assert g1 == g2 and g1 != eager
    # every captured call records its own write (a replay does not rely on an earlier one)
    assert [s[0] for s in fake_device["stores"]].count(g1) == 2
    # eager maps filling up free the eager slots only
    monkeypatch.setattr(maps, "MAX_KEPT", 4)
    for i in range(12):
        maps.operand_maps((_op((10 + i) << 30), _op(2 << 30)), stream=7)
    assert maps.operand_maps(ops, stream=11, graph=True) == g1
    eager_slots = set(maps._EAGER_SLOTS.free)
    assert g1 not in eager_slots


def test_a_graphs_workspace_is_kept_for_good(fake_device, monkeypatch):
    class Bound:
        def __init__(self):
            self.scratch = {}

    b, other = Bound(), Bound()
    before = len(memory.GRAPH_OWNED)
    monkeypatch.setattr(launch, "SCRATCH_BYTES", 1)   # anything eager is evicted at once
    launch._keep(b, ("w", 9, True), ("graph buffer", 123), 10**9, graph=True)
    launch._keep(b, ("w", 7, False), ("eager buffer", 456), 10**9)
    launch._keep(other, ("w", 8, False), ("eager buffer", 789), 10**9)
    assert b.scratch[("w", 9, True)] == ("graph buffer", 123)
    assert ("w", 7, False) not in b.scratch
    assert len(memory.GRAPH_OWNED) == before + 1
    memory.GRAPH_OWNED.pop()


def test_eviction_spares_the_buffers_of_the_call_under_way(fake_device, monkeypatch):
    """Past the budget the oldest kept buffers go, but not the plan's own: a call that keeps
    a transposed B and then a transposed A has launched work on the first already."""
    class Bound:
        def __init__(self):
            self.scratch = {}

    other, b = Bound(), Bound()
    monkeypatch.setattr(launch, "_SCRATCH", launch.OrderedDict())
    monkeypatch.setattr(launch, "SCRATCH_BYTES", 100)
    launch._keep(other, ("w", 7, False), "other's", 60)
    launch._keep(b, ("bt", 7, False), "B transposed", 80)    # over: the other plan's go
    launch._keep(b, ("at", 7, False), "A transposed", 80)    # over, but both are b's
    assert not other.scratch
    assert b.scratch == {("bt", 7, False): "B transposed", ("at", 7, False): "A transposed"}


class _Freed:
    """A buffer that notes when its last reference goes (torch's allocator takes it back)."""

    def __init__(self, log, name):
        self.log, self.name = log, name

    def __del__(self):
        self.log.append(self.name)


def test_a_captured_torch_calls_buffers_are_the_graphs_temporaries(fake_device):
    """With torch's memory (the graph's private pool) the buffers and map slot a captured
    call makes are held until its launches are recorded, then handed back -- nested calls
    share the outer scope -- and nothing is kept with the plan or for good."""
    class Bound:
        scratch = {}

    b, freed = Bound(), []
    before = len(memory.GRAPH_OWNED)
    with memory.CapturedCall():
        assert memory.holding()
        launch._keep(b, ("w", 9, True), (_Freed(freed, "work"), 123), 10**9, graph=True)
        slot = maps.operand_maps((_op(1 << 30), _op(2 << 30)), stream=9, graph=True)
        assert fake_device["stores"][-1][0] == slot and not maps._GRAPH_KEPT
        with memory.CapturedCall():   # a call inside the call (the rounding, a bias)
            memory.keep_for_graphs(_Freed(freed, "inner"))
        assert freed == []            # held until the outer call's launches are recorded
    assert sorted(freed) == ["inner", "work"] and not memory.holding()
    assert b.scratch == {} and len(memory.GRAPH_OWNED) == before


def test_the_torch_front_end_does_not_import_cupy():
    pytest.importorskip("torch")
    code = ("import sys, torch, gemmlib, gemmlib.torch_op as g;"
            "x = torch.randn(3, 8); w = torch.randn(4, 8);"
            "y = g.linear(x, w); assert 'cupy' not in sys.modules, 'cupy imported'")
    env = {**__import__("os").environ, "NUMBA_ENABLE_CUDASIM": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr


@pytest.fixture
def bound_plan(monkeypatch, fake_device):
    """A bound plan of a Hopper rung, its compile stubbed; copies and maps recorded."""
    from gemmlib import dispatch
    from gemmlib.runtime import select

    class _Compiled:
        def function(self, ctx, shared=0):
            return 0

    monkeypatch.setattr(launch, "compiled_spec", lambda s: _Compiled())
    monkeypatch.setattr(launch, "compiled_prep", lambda s, operand="b": _Compiled())
    fake_device["copies"], fake_device["maps"] = [], []
    monkeypatch.setattr(memory, "copy_async", lambda dst, src, n, stream:
                        fake_device["copies"].append((dst, src, n, stream)))

    def operand_maps(ops, stream=0, words=(), graph=False):
        fake_device["maps"].append((ops, graph))
        return 10_000 + len(fake_device["maps"])

    monkeypatch.setattr(maps, "operand_maps", operand_maps)

    def make(rung, M, N, K, **params):
        p = dispatch.plan(select.build(rung, params), M, N, K)
        return launch._Bound(p, 0), p

    return make


@pytest.mark.parametrize("rung, params", [("wgmma_ws", dict(precision="fp16")),
                                          ("wgmma_swap", dict(precision="bf16"))])
def test_a_new_small_activation_is_staged_not_mapped(bound_plan, fake_device, rung, params):
    """A decode-sized A at a new address every call (a model's next activation) is copied
    into the plan's kept buffer, whose maps are written once; the weight stays where it is;
    a swap-AB rung's maps take the weight as their A."""
    b, p = bound_plan(rung, 16, 256, 512, **params)
    W = 1 << 32
    got = [launch._maps_for_call(b, p, (5 << 30) + 4096 * i, W, 0, 7) for i in range(5)]
    copies = fake_device["copies"]
    assert len(copies) == 5 and {c[0] for c in copies} == {got[0][1]}
    assert [c[1] for c in copies] == [(5 << 30) + 4096 * i for i in range(5)]
    assert {c[2] for c in copies} == {16 * 512 * 2} and {c[3] for c in copies} == {7}
    assert len(fake_device["maps"]) == 1 and len({g for g in got}) == 1
    ops = fake_device["maps"][0][0]
    kernel_a = ops[0][0]
    assert kernel_a == (W if p.spec.swap_ab else got[0][1])
    # an A met again (a loop over the same operands) gets maps of its own: no more copies
    again = launch._maps_for_call(b, p, 5 << 30, W, 0, 7)
    assert again[1] == 5 << 30 and len(copies) == 5 and len(fake_device["maps"]) == 2
    assert launch._maps_for_call(b, p, 5 << 30, W, 0, 7) == again
    assert len(copies) == 5 and len(fake_device["maps"]) == 2


def test_a_large_or_captured_a_is_mapped_where_it_is(bound_plan, fake_device):
    b, p = bound_plan("wgmma_ws", 2048, 256, 512, precision="fp16")   # 2 MB of A
    assert b.stage_a == 0
    first = launch._maps_for_call(b, p, 5 << 30, 1 << 32, 0, 7)
    again = launch._maps_for_call(b, p, 5 << 30, 1 << 32, 0, 7)
    assert first == again and first[1] == 5 << 30 and len(fake_device["maps"]) == 1
    small, ps = bound_plan("wgmma_ws", 16, 256, 512, precision="fp16")
    addr, a = launch._maps_for_call(small, ps, 6 << 30, 1 << 32, 0, 9, graph=True)
    assert a == 6 << 30 and not fake_device["copies"]
    assert fake_device["maps"][-1][1] is True and fake_device["maps"][-1][0][0][0] == 6 << 30


def test_buffers_between_launches_are_each_threads_own(bound_plan, fake_device):
    """Two threads calling on one stream interleave their launches: a buffer one call fills
    in one launch and reads in the next (a staged A, the slices' sums) is per thread."""
    import threading

    b, p = bound_plan("wgmma_ws", 16, 256, 512, precision="fp16")
    mine = launch._maps_for_call(b, p, 5 << 30, 1 << 32, 0, 7)[1]
    assert launch._maps_for_call(b, p, 6 << 30, 1 << 32, 0, 7)[1] == mine
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(
        launch._maps_for_call(b, p, 8 << 30, 1 << 32, 0, 7)[1]))
    t.start()
    t.join()
    assert theirs and theirs[0] != mine


def test_the_transposing_pre_passes_launch_into_kept_buffers(bound_plan, fake_device,
                                                             monkeypatch):
    """tf32's pre-passes: B (K, N) and a column-major A (K, M) transposed into buffers kept
    per stream, the launch's two data words the source and the buffer, the grids over the
    source's rows and columns; the kernel then reads the buffers."""
    launches = []
    monkeypatch.setattr(launch, "_launch", lambda fn, grid, block, shared, stream, words:
                        launches.append((grid, words[launch._DATA[0]],
                                         words[launch._DATA[1]], stream)))
    b, p = bound_plan("wgmma_tf32", 40, 72, 36, BN=64, STAGES=2, A_LAYOUT="KM")
    bt = launch._prepared_b(b, p, 1 << 30, 7)
    at = launch._prepared_a(b, p, 2 << 30, 7)
    assert bt != at and launch._prepared_b(b, p, 3 << 30, 7) == bt
    (g_b, src_b, dst_b, s_b), (g_a, src_a, dst_a, _), _ = launches
    assert (src_b, dst_b, s_b) == (1 << 30, bt, 7) and (src_a, dst_a) == (2 << 30, at)
    assert g_b == p.spec.b_prep_grid(36, 72) and g_a == p.spec.a_prep_grid(36, 40)
    assert b.stage_a == 0   # the pre-pass reads A where it lies


def test_a_dropped_driver_buffer_is_freed_later_and_never_inside_a_capture(monkeypatch):
    """A driver buffer is not tied to a stream (the one it served may be gone): dropping it
    queues its free, which runs at the next safe point and not inside a captured call."""
    freed = []

    class Driver:
        def synchronize(self):
            freed.append("synchronized")

        def mem_free(self, ptr):
            freed.append(ptr)

    monkeypatch.setattr(memory, "driver", lambda: Driver())
    monkeypatch.setattr(memory, "_PENDING", [])
    buf = memory.DeviceBuffer(0x1000, 256, None, memory._PENDING.append)
    del buf
    assert memory._PENDING == [0x1000] and not freed
    with memory.CapturedCall():
        memory.release_pending()
    assert not freed
    memory.release_pending()
    assert freed == ["synchronized", 0x1000] and not memory._PENDING


def test_launch_configurations_carry_the_cluster_and_early_launch_attributes():
    from gemmlib.runtime.driver import launch_config

    early = launch_config((132, 1, 1), (384, 1, 1), 1024, 7, early=True)
    assert early.num_attrs == 1 and early.attrs[0].id == 6 and early.attrs[0].value.flag == 1
    both = launch_config((132, 1, 1), (384, 1, 1), 1024, 7, cluster=2, early=True)
    assert both.num_attrs == 2 and both.attrs[0].id == 4 and both.attrs[0].value.cluster.x == 2
    assert both.attrs[1].id == 6
    assert launch_config((1, 1, 1), (32, 1, 1), 0, 0, cluster=2).num_attrs == 1


def test_the_hopper_rungs_that_wait_first_are_launched_early():
    """Every rung built on the warp-specialised ring starts with ``early_launch``."""
    from gemmlib.kernels import get as get_kernel

    for name in ("wgmma_ws", "wgmma_split_k", "wgmma_swap", "wgmma_store", "wgmma_pingpong",
                 "wgmma_cluster", "wgmma_tf32", "wgmma_fp8"):
        assert get_kernel(name).early_launch, name
    assert not get_kernel("wgmma_tma").early_launch
