"""GEMM over several GPUs (or CPU processes): all-gather, reduce-scatter and SUMMA.

One process per GPU, launched the standard way::

    torchrun --nproc-per-node=4 my_script.py

and in each process::

    import os, torch, torch.distributed as dist
    from gemmlib import distributed as gd

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))     # set by torchrun
    dist.init_process_group("nccl")
    # this rank's row block of A and column block of B (any sizes, even uneven or empty)
    C_cols = gd.allgather_matmul(A_rows, B_cols, gather="A", overlap=True)   # C[:, my columns]
    C_rows = gd.allgather_matmul(A_rows, B_cols, gather="B", overlap=True)   # C[my rows, :]
    C_blk = gd.summa(A_blk, B_blk, grid=(2, 2))                              # C[my rows, my cols]
    C_rows = gd.matmul_reduce_scatter(A_cols, B_rows)  # K split: sum of partials, C[my rows, :]
    C_cols = gd.allgather_matmul(A_rows, B_cols, gather="A", transport="copy")  # copy engines

The engine
----------
Communication goes through ``torch.distributed``: NCCL between GPUs, gloo
between CPU processes.  Not CuPy's NCCL bindings, because torch.distributed
brings what those leave to the caller:

* the launcher (``torchrun``: ranks, rendezvous, the environment) and the
  process groups, sub-groups included (SUMMA's process rows and columns are
  ``torch.distributed.new_group`` s);
* asynchronous collectives that return a work handle (``async_op=True``),
  whose ``wait()`` makes the *current CUDA stream* wait for the NCCL kernel
  without blocking the host: that is the whole overlap mechanism below;
* the same code on CPU processes through gloo, so every algorithm here runs
  and is tested in CI without a GPU (``tests/test_distributed.py``);
* the baseline the measurements compare with (``torch.matmul`` + NCCL) in
  the same framework.

With ``transport="nccl"`` (the default) every transfer is a torch.distributed
collective (all-gather, broadcast, reduce-scatter).  NCCL's collectives are
kernels: while they run they hold SMs that the products wanted.  With
``transport="copy"`` the bytes move by the GPUs' copy engines instead: each
rank's shard sits in a buffer every peer has mapped (torch's symmetric
memory, CUDA IPC over NVLink, no multicast), and a peer pulls it with a
``cudaMemcpyAsync`` while all its SMs compute (``_peer.py``).  Every local
product is :func:`local_product`, which is ``gemmlib.matmul`` on CUDA
tensors (on torch's current stream) and a NumPy product on CPU tensors.
Results are float32 (gemmlib accumulates fp16/bf16 products in fp32 and
returns fp32).

The algorithms
--------------
* :func:`allgather_matmul`, 1-D tensor parallelism.  A is split by rows and B
  by columns over the P ranks (rank r holds ``A[rows_r, :]`` and
  ``B[:, cols_r]``).  ``gather="A"`` all-gathers A, and each rank computes
  ``C[:, cols_r] = A @ B[:, cols_r]``; ``gather="B"`` all-gathers B and each
  rank computes ``C[rows_r, :] = A[rows_r, :] @ B``.  Each GPU receives
  (P-1)/P of the gathered operand and does 1/P of the flops, so gather the
  smaller one (A when M < N).
* ``overlap=True``: the all-gather is cut into ``chunks`` pieces, all issued
  at once on a communication stream; the product of the rank's own shard
  (which needs no communication) runs while the first chunk is gathered,
  and the products of chunk i run while chunk i+1 is gathered.
* :func:`matmul_reduce_scatter`, the row-parallel layer: K is split over
  the ranks, each multiplies its slice, and the partial sums are added and
  scattered by rows of C.
* :func:`summa`, on a Pr x Pc process grid (:class:`ProcessGrid`): rank
  (i, j) holds block (i, j) of A, B and C.  K is cut into panels; for each
  panel the owner of A's panel broadcasts it along its process row and the
  owner of B's panel along its process column, and every rank adds
  ``A_panel @ B_panel`` to its block of C.  ``pipelined=True`` issues the
  next panel's broadcasts before the current panel's product.  Any P: the
  default grid is the squarest factorisation (a prime P gives 1 x P).

Uneven shards
-------------
Shards may have any sizes (M < P gives empty shards).  NCCL's all-gather
needs every rank to send the same number of elements, so each rank's piece
is flattened and padded at its *end* to the largest piece's size; the
receive buffer is ``(P, largest)``, and rank r's piece is the first
``rows_r * cols_r`` elements of row r, viewed as its own shape: contiguous,
so the local products read it in place; the padding is never read.  When
all pieces are the same size nothing is padded or copied.

Who holds which sizes is learnt in one small all-gather of a few integers
per rank (shapes, dtype, options), from which every rank checks every other
rank's operands and raises the *same* error (never a hang on one rank and an
error on another).  That exchange waits for the GPU (the sizes go to the
host); pass ``sizes=`` to skip it once the layout is known (then nothing is
checked across ranks).

Streams on a GPU
----------------
Local products run on torch's current stream (the *compute* stream).
Every buffer a transfer touches is recorded on the communication stream and
held until the call returns: torch's caching allocator would otherwise give
a staging buffer, freed by Python as soon as its collective was issued, to
the next piece before NCCL had read it (a wrong product on 4 GPUs at three
chunks, reproduced on CPU processes by ``tests/test_distributed.py``).
Collectives are issued from a side stream (the *communication* stream) that
first waits for the compute stream, so that NCCL does not wait for products
queued earlier; after each collective the communication stream waits for it
(``work.wait()`` in that stream's context), and a CUDA event recorded there
is what the compute stream waits on before using the data.  Collectives on
different groups (SUMMA's rows and columns) are thereby chained in the same
order on every rank, as NCCL requires of concurrent communicators.  The host
never blocks.  On CPU processes the same code path issues gloo's
asynchronous collectives and waits on their handles.

:class:`Timeline` records when each product and each collective ran (CUDA
events on a GPU, ``time.perf_counter`` on CPU), for the overlap figures.

What it costs beyond the products and the collectives
-----------------------------------------------------
* SUMMA adds each panel's product into C through a temporary (``C += T``):
  ``gemmlib.matmul`` has no accumulating form.  Hence the default of one
  panel per stretch of K with the same owners.
* ``gather="B"`` writes column blocks of C, which are strided: their
  products go through a temporary and a copy (without overlap, B's blocks
  are concatenated once instead).
* The metadata exchange waits for the GPU (``sizes=`` skips it).
"""


from __future__ import annotations

from ._checks import DTYPES, _all_gather_flat
from ._layout import grid_shape, offsets, panels, result_slices, split_sizes
from ._run import local_product
from ._timeline import Timeline, summarize
from .allgather import allgather_matmul
from .reduce_scatter import matmul_reduce_scatter
from .spawn import spawn_cpu
from .summa import ProcessGrid, summa

#: an all-gather of equal flat pieces (``out`` holds P of ``inp``), for baselines and tests
all_gather_flat = _all_gather_flat

__all__ = [
    "allgather_matmul", "matmul_reduce_scatter", "summa", "ProcessGrid", "Timeline",
    "local_product", "split_sizes", "offsets", "grid_shape", "panels", "result_slices",
    "spawn_cpu", "summarize", "all_gather_flat", "DTYPES",
]
