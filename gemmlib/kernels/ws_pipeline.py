"""The warp-specialised pipeline, written once: the ring of stages the Hopper rungs share.

``wgmma_ws`` builds it (its docstring tells why): STAGES stages of shared memory, each
guarded by a *full* mbarrier (the producer's TMA bytes have landed) and an *empty* one
(the consumers' wgmma have read it).  The producer and the consumers count the same ring
positions ``it = 0, 1, 2, ...``, on across tiles: position ``it`` is stage ``it % STAGES``
in its ``it // STAGES``-th use, whose phase has parity ``(it // STAGES) % 2``.  Both are
computed from the position's low 32 bits: a 64-bit signed remainder costs the ring several
instructions per k-tile, and no launch walks 2^32 k-tiles through one block's ring.  The rungs
built on it -- ``wgmma_ws`` (and through its kernel ``wgmma_tf32`` and ``wgmma_fp8``),
``wgmma_store``, ``wgmma_pingpong``, ``wgmma_cluster``, ``wgmma_split_k`` and
``wgmma_swap`` -- differ in the tiles they walk and what they do around the ring, so the
ring's parts live here and each rung's kernel keeps only its own idea:

* ``acquire_maps(maps)``: the producer's tensor maps of A and B, acquired once;
* ``fill(ring, bars, full, it, k0, k1, maps, m0, n0, b_row) -> it``: the producer's copies
  of one tile's k-tiles ``k0 .. k1`` into the ring from position ``it`` (``m0, n0, b_row``
  go to the rung's ``load_stage``);
* ``mma(ring, bars, full, acc, slice_, it, ph, k0, k1, t, rank) -> (it, ph)``: a consumer's
  wgmma over those k-tiles (``slice_``: the byte offset of its rows in A's tile), each stage
  released once the next k-tile's wgmma is issued and its own has finished
  (``wgmma.wait_group 1``), so one wgmma is always in flight;
* ``drain(bars, it, k0, k1, t, rank)``: the last wgmma waited for, its stage released;
* ``early_launch()``: each kernel's first step, so the runtime may launch it while the
  stream's previous kernel finishes (programmatic dependent launch).

``full`` is the index of stage 0's full barrier in ``bars``, ``EMPTY`` (a build constant)
that of stage 0's empty barrier.  Two hooks change the ring's bookkeeping, not its shape:
``take(bars, full, s, it, ph) -> ph`` waits until stage ``s`` holds position ``it`` (by
default by the position's parity; ``ph`` is state of the rung's own, such as
``wgmma_pingpong``'s per-stage phase bits, whose consumers skip each other's positions),
and ``release(bars, i, t, rank)`` tells that position ``i`` has been read (by default one
arrival on its empty barrier; ``wgmma_cluster``'s tells every block of the cluster;
``t``: the thread, ``rank``: the block's rank in its cluster).
"""

from typing import NamedTuple

from gemmlib.backend import cuda, uint64
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.index import u32
from gemmlib.kernels.wgmma_async import BK
from gemmlib.kernels.wgmma_tma import wait


class Ring(NamedTuple):
    """The device functions of one build's ring (module docstring)."""
    fill: object
    mma: object
    drain: object


@cuda.jit(device=True)
def early_launch():
    """The first step of a kernel that may be launched early (``KernelSpec.early_launch``:
    with programmatic stream serialization, so that its blocks are placed while the
    stream's previous kernel drains): wait until that kernel has finished and its writes
    (activations, tensor maps, counters) are visible, then let the stream's next such
    kernel be placed in turn.  Nothing before it may touch global memory."""
    H.grid_dependency_wait()
    H.launch_dependents()


@cuda.jit(device=True)
def acquire_maps(maps):
    """The producer's tensor maps of A and B (the first two of ``maps``) made visible to its
    copies before the first of them."""
    H.tensormap_acquire(maps)
    H.tensormap_acquire(maps + uint64(128))


def ring_parts(STAGES: int, STAGE_BYTES: int, A_BYTES: int, load_stage, k_tile, KT: int = BK,
               EMPTY: int | None = None, take=None, release=None) -> Ring:
    """The ring of STAGES stages of STAGE_BYTES (A's tile first, A_BYTES of it):
    ``load_stage(ring, s, bar, maps, k0, m0, n0, b_row)`` copies the KT k elements at ``k0``
    into stage ``s`` and ``k_tile(a, b, acc)`` issues their wgmma.  ``EMPTY``: the index of
    stage 0's empty barrier (default STAGES: full[s] = s, empty[s] = STAGES + s)."""
    EMPTY = STAGES if EMPTY is None else EMPTY
    wait0, wait1 = H.wgmma_wait(0), H.wgmma_wait(1)

    @cuda.jit(device=True)
    def fill(ring, bars, full, it, k0, k1, maps, m0, n0, b_row):
        for kt in range(k0, k1):
            s = u32(it) % STAGES
            # the phase before this use: a fresh barrier passes it, so the first fills go
            wait(H.smem_addr(bars, EMPTY + s), ((u32(it) // STAGES) % 2) ^ 1)
            load_stage(ring, s, H.smem_addr(bars, full + s), maps, kt * KT, m0, n0, b_row)
            it += 1
        return it

    if take is None:
        @cuda.jit(device=True)
        def take(bars, full, s, it, ph):
            wait(H.smem_addr(bars, full + s), (u32(it) // STAGES) % 2)
            return ph

    if release is None:
        @cuda.jit(device=True)
        def release(bars, i, t, rank):
            H.mbarrier_arrive(H.smem_addr(bars, EMPTY + u32(i) % STAGES))

    @cuda.jit(device=True)
    def mma(ring, bars, full, acc, slice_, it, ph, k0, k1, t, rank):
        for kt in range(k0, k1):
            s = u32(it) % STAGES
            ph = take(bars, full, s, it, ph)
            H.wgmma_fence()
            k_tile(ring + s * STAGE_BYTES + slice_, ring + s * STAGE_BYTES + A_BYTES, acc)
            H.wgmma_commit()
            wait1()                          # the previous k-tile's wgmma is done:
            if kt > k0:                      # its stage may be refilled
                release(bars, it - 1, t, rank)
            it += 1
        return it, ph

    @cuda.jit(device=True)
    def drain(bars, it, k0, k1, t, rank):
        wait0()
        if k1 > k0:
            release(bars, it - 1, t, rank)

    return Ring(fill, mma, drain)
