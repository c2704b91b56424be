"""Hopper's warpgroup MMA: one instruction per 64 x N x 16 step, operands straight from shared memory.

``mma_pipeline`` spends most of its issue slots on bookkeeping: every k-step
each warp loads its A and B fragments from shared memory into registers
(``ldmatrix``) and issues many small ``mma.sync`` atoms.  On an H100 those
atoms reach about half the tensor cores' rate (``mma_roof``).  Hopper's
``wgmma.mma_async`` changes the unit of work:

* **A warpgroup** -- four consecutive warps, 128 threads -- issues *one*
  instruction for a 64 x N x 16 product (N up to 256).  A and B are not
  loaded into registers at all: the instruction reads them from shared
  memory through two 64-bit *matrix descriptors* (address, the strides
  between 8-row core-matrix groups, the swizzle mode).  Only the fp32
  accumulators live in registers, N/2 per thread.
* **It is asynchronous.**  ``wgmma.fence`` orders earlier register writes
  before it, ``commit_group`` closes a batch, ``wait_group n`` waits until at
  most n batches are in flight; the tensor cores work while the warps move on.
* **The tiles are 128-byte swizzled**, the layout of the layout chapter
  (``gemmlib.layout.chunk_swizzle``): rows of 64 halves whose 16-byte chunks
  are XOR-ed with ``row % 8``.  A's tile is K-major (a row of A is a row of
  the tile); B's is *MN-major*: B is (K, N) row-major, so a tile row is 64
  consecutive n of one k, and the instruction's ``trans-b`` flag says so.
  B's tile is BN/64 panels of 64 k x 64 n; the descriptor's LBO steps from
  panel to panel, SBO from one group of 8 k to the next.

This rung changes only the compute: one warpgroup, BM x BN = 128 x 128 per
block (two m64n128k16 per k-step), fed by ``mma_pipeline``'s ring of
``cp.async`` copies (16 bytes each, written straight to their swizzled
place, zeros past M, N and K).  After a tile has landed each thread makes its
own copies visible to the *async proxy* (``fence.proxy.async``: wgmma reads
shared memory through a different path than ordinary loads), the block
synchronises, and the warpgroup issues 4 k-steps x 2 instructions.

Inputs are fp16 or bf16 (``precision``), accumulation fp32; K and N must be
multiples of 8 (16-byte rows; ``gemmlib.matmul`` pads other shapes).  Needs
sm_90a (H100/H200): other GPUs get a ``ConstraintError``.

The pieces the later (TMA) rungs share live here too, with two options of theirs:

* **B as torch holds a weight** (``B_LAYOUT="NK"``).  ``F.linear(x, W)`` is
  ``x @ W.T`` with W (N, K) row-major: B is *K-major*, wgmma's own layout.  Its
  tile is then A's: BN rows of 64 halves (128 bytes, 128-byte swizzled), the
  descriptor stepping 32 bytes per k-step with SBO 1024 between groups of 8
  rows, and the instruction is built without trans-b (:func:`mma_source`,
  :func:`warpgroup_code`).  Only K must be a multiple of 8 (B's rows are K
  long); the rung is named ``..._nk`` and ``gemmlib.dispatch`` passes B as (N, K).
* **A column-major A** (``A_LAYOUT="KM"``, 16-bit types only).  A weight gradient
  dW = dY^T X reads ``dY.t()``: A given as the (K, M) row-major memory.  Its tile is then
  MN-major, as a (K, N) B's: BM/64 panels of 64 k x 64 m (TMA boxes of the (K, M)
  matrix, ``wgmma_tma.a_loader``), read with wgmma's trans-a and a descriptor like B's
  (LBO from panel to panel, SBO between groups of 8 k, a k-step 16 rows down).  A
  warpgroup's 64-row slice is one panel, at the same offset as a K-major slice.  M
  must be a multiple of 8 (A's rows are M long); the rung is named ``..._km``,
  ``KernelSpec.a_operand`` is "KM" and ``gemmlib.dispatch`` passes and maps A as (K, M).
* **A bias** (``BIAS=True``, :func:`bias_code`).  The kernel takes a fourth array
  right after C, ``bias`` (1, N) in the inputs' element type (uint16 bits), or
  (0, N) for none -- one compiled kernel for both: the test is uniform.  Each
  accumulator gets ``bias[0, col]`` (fp16 bits through ``cvt.f32.f16``, bf16
  bits shifted into a float32's top half) before the single rounding and store
  into C: ``F.linear(x, W, b)`` in one kernel.  Builds without a bias keep their
  arguments (A, B, C, maps) (:func:`bias_entry`) and their names.
"""

from gemmlib.backend import SIMULATOR, cuda, float32, uint16
from gemmlib.intrinsics import async_copy
from gemmlib.intrinsics import hopper as H
from gemmlib.intrinsics.index import int64, u32, uidx
from gemmlib.intrinsics.vector import aligned8, store2
from gemmlib.kernels.mma_atom import ARG_DTYPES, INPUT_DTYPE
from gemmlib.spec import Constraint, KernelSpec, cdiv

#: what wgmma computes here: 16-bit inputs (tf32 wgmma has no MN-major B)
PRECISIONS = ("fp16", "bf16")
#: halves per k-tile: one 128-byte swizzled row
BK = 64
#: bytes of one 128-byte-swizzled tile row, and of a group of 8 rows (the swizzle's period)
ROW_BYTES, GROUP_BYTES = 128, 1024
#: bytes of one 64-row slice of A's tile (one wgmma's M) and of one 64 x 64 panel of B
SLICE_BYTES = PANEL_BYTES = 64 * ROW_BYTES
#: a k-step (16 halves) moves A's descriptor 32 bytes along its rows, B's 16 rows down
A_KSTEP, B_KSTEP = 32, 16 * ROW_BYTES


@cuda.jit(device=True)
def swizzled(row, chunk):
    """Element offset of 16-byte ``chunk`` of ``row`` in a 128-byte-swizzled tile."""
    return row * BK + ((chunk ^ (row % 8)) * 8)


def mma_source(BN: int, halves: int, ab: str, b_layout: str = "KN", a_layout: str = "MK") -> str:
    """Source of ``k_tile(a, b, acc)``: the 4 k-steps of one k-tile for ``halves`` 64-row
    slices of A's tile (a, b: shared addresses of the tiles), written out so that every
    descriptor offset is a constant.  Each wgmma updates slice h's BN/2 accumulators,
    ``acc[h * BN/2:(h + 1) * BN/2]``, in place: the intrinsic's array form is one call for
    numba to type, and once inlined its constant indices keep ``acc`` in registers.

    ``b_layout``: "KN", B's tile MN-major (64-column panels, LBO from panel to panel, a
    k-step 16 rows down); "NK", B's tile K-major as A's (BN rows of 64 halves, a k-step 32
    bytes along the rows, SBO from one group of 8 rows to the next).

    ``a_layout``: "MK", A's tile K-major (BM rows of 64 halves; slice h is rows 64h..);
    "KM", A's tile MN-major as a KN B's (BM/64 panels of 64 k x 64 m; slice h is panel h,
    which starts PANEL_BYTES * h in -- the same offset as the K-major slice's, both being
    64 x 64 halves -- and a k-step moves 16 k-rows down)."""
    R = BN // 2
    # Each descriptor is built once per k-tile; a k-step or a slice moves only its start
    # address, which the descriptor holds >> 4 in its low bits (shared addresses stay below
    # 2^18 bytes, so the add never carries out of that field): one 64-bit add per wgmma
    # instead of the masks, shifts and ors of a fresh descriptor.
    if a_layout == "KM":
        lines = ["def k_tile(a, b, acc):", f"    da = desc(a, {PANEL_BYTES}, {GROUP_BYTES}, 1)"]
        a_step = B_KSTEP
    else:
        lines = ["def k_tile(a, b, acc):", f"    da = desc(a, 16, {GROUP_BYTES}, 1)"]
        a_step = A_KSTEP
    if b_layout == "NK":
        lines.append(f"    db = desc(b, 16, {GROUP_BYTES}, 1)")
        b_step = A_KSTEP
    else:
        lines.append(f"    db = desc(b, {PANEL_BYTES}, {GROUP_BYTES}, 1)")
        b_step = B_KSTEP

    def plus(d, offset):
        return f"{d} + u64({offset // 16})" if offset else d

    for kk in range(BK // 16):
        for h in range(halves):
            lines.append(f"    mma({plus('da', h * SLICE_BYTES + kk * a_step)}, "
                         f"{plus('db', kk * b_step)}, one, acc, {h * R})")
    return "\n".join(lines) + "\n"


def store_source(BN: int, halves: int, convert: str = "", pair: str = "store2",
                 aligned: str = "aligned8") -> str:
    """Source of ``store_acc(C, acc, t, m0, n0, M, N)``: thread ``t`` of a warpgroup writes
    its accumulators (``H.accumulator_coords``) of ``halves`` 64-row slices, inside C only.

    A thread holds pairs of adjacent columns, so each pair goes out as one store ``pair``
    (``st.global.v2.f32`` for a float32 C: half the store instructions of element-wise
    stores, and each group of four lanes fills a 32-byte sector of a row).  That needs an
    even row length and a C aligned for the pair (``aligned``; checked once, a uniform
    branch; else element-wise stores).  ``convert`` names a function applied to each value
    first (``bf16`` for a bf16 C of uint16 bits, with ``store2_u16`` and ``aligned4``).
    The columns here are even, so a pair is either wholly inside C or wholly outside.

    Each of a thread's rows (two per slice: g and g + 8) is one loop along the columns.
    Its trip count is a constant and NVVM unrolls it completely, so every index of ``acc``
    is a constant again and ``acc`` stays in registers (the compile gate checks the PTX
    for local memory).  A loop per row, not one over all the pairs: NVVM unrolls only
    loops below a size, and with ``bf16`` conversions one loop over the whole slice is
    above it.  (Written out pair by pair instead, the function costs numba thousands of
    typed operations: most of a rung's cold compile.)"""
    R = BN // 2

    def val(k):   # accumulator k + 4j: column pair j of the row
        i = f"acc[4 * j + {k}]" if k else "acc[4 * j]"
        return f"{convert}({i})" if convert else i

    def rows(store):
        out = []
        for h in range(halves):
            for half in range(2):
                k = h * R + 2 * half
                out += [f"r = r0 + {64 * h + 8 * half}" if h or half else "r = r0",
                        "if r < M:",
                        f"    for j in range({BN // 8}):",
                        "        c = c0 + 8 * j",
                        "        if c < N:"]
                out += ["            " + ln for ln in store(k)]
        return ["        " + ln for ln in out]

    lines = ["def store_acc(C, acc, t, m0, n0, M, N):",
             "    w, lane = t // 32, t % 32",
             "    r0 = m0 + 16 * w + lane // 4     # row g of slice 0; then g + 8, g + 64, ...",
             "    c0 = n0 + 2 * (lane % 4)",
             f"    if N % 2 == 0 and {aligned}(C):"]
    lines += rows(lambda k: [f"{pair}(C, uidx(r), uidx(c), {val(k)}, {val(k + 1)})"])
    lines += ["    else:"]
    lines += rows(lambda k: [f"C[uidx(r), uidx(c)] = {val(k)}",
                             "if c + 1 < N:",
                             f"    C[uidx(r), uidx(c + 1)] = {val(k + 1)}"])
    return "\n".join(lines) + "\n"


def grouped_order(BM: int, BN: int, GROUP_M: int):
    """``tile_origin(pid, M, N) -> (m0, n0)`` as a plain function: tile ``pid`` in grouped
    order (``mma_pipeline``'s): GROUP_M block-rows sweep the columns together, so the B
    tiles they share are still in L2.  :func:`tile_order` compiles it for the kernels; the
    chapters call it as it is (``gemmcourse.viz_hopper.wave_traffic``)."""
    def tile_origin(pid, M, N):
        tiles_m, tiles_n = (M + BM - 1) // BM, (N + BN - 1) // BN
        span = u32(GROUP_M * tiles_n)
        first_m = int64(u32(pid) // span) * GROUP_M
        rows = u32(min(tiles_m - first_m, GROUP_M))
        at = u32(pid) % span
        return (first_m + int64(at % rows)) * BM, int64(at // rows) * BN

    return tile_origin


def tile_order(BM: int, BN: int, GROUP_M: int):
    """``tile_origin(pid, M, N) -> (m0, n0)``: :func:`grouped_order`, a device function."""
    return cuda.jit(device=True)(grouped_order(BM, BN, GROUP_M))


def warpgroup_code(precision: str, BN: int, halves: int, out: str = "fp32",
                   b_layout: str = "KN", a_layout: str = "MK"):
    """The generated device functions (k_tile, store_acc) for ``halves`` slices of 64 x BN.
    ``out``: what C holds (:func:`out_store`): "fp32", or the inputs' own 16-bit type.
    ``b_layout``, ``a_layout``: how B's and A's tiles lie in shared memory (:data:`B_LAYOUTS`,
    :data:`A_LAYOUTS`)."""
    check_a_layout(a_layout, precision)
    if precision not in PRECISIONS:
        raise ValueError(f"the wgmma rungs compute in {PRECISIONS} (tf32 wgmma cannot read "
                         f"a row-major B), got {precision!r}")
    check_layout(b_layout)
    # trans-b: B's tile is MN-major (KN); an NK tile is K-major, wgmma's own layout.
    # trans-a: A's tile is MN-major (KM); an MK tile is K-major
    mma = (H.wgmma_f16 if precision == "fp16" else H.wgmma_bf16)(
        BN, trans_b=b_layout == "KN", in_place=True, trans_a=a_layout == "KM")
    env = {"desc": H.smem_desc, "mma": mma, "uidx": uidx, "u64": uidx, "store2": store2,
           "aligned8": aligned8}
    return compile_sources((mma_source(BN, halves, precision, b_layout, a_layout),
                            out_store(BN, halves, precision, out, env)), env)


#: how B is given.  "KN": (K, N) row-major, its tile MN-major in shared memory (wgmma's
#: trans-b).  "NK": (N, K) row-major -- an ``nn.Linear`` weight, ``F.linear(x, W) = x @ W.T``
#: -- its tile K-major like A's, the layout wgmma reads without transposing
B_LAYOUTS = ("KN", "NK")


def check_layout(b_layout: str) -> None:
    if b_layout not in B_LAYOUTS:
        raise ValueError(f"B_LAYOUT must be one of {B_LAYOUTS}, got {b_layout!r}")


#: how A is given.  "MK": (M, K) row-major, its tile K-major (wgmma's own layout).  "KM":
#: A column-major, given as its (K, M) row-major memory -- ``X.t()`` of a row-major X (K, M),
#: as in a weight gradient dW = dY^T X -- its tile MN-major as a (K, N) B's (wgmma's
#: trans-a, which only the 16-bit types have: tf32 and FP8 wgmma read A K-major)
A_LAYOUTS = ("MK", "KM")


def check_a_layout(a_layout: str, precision: str | None = None) -> None:
    if a_layout not in A_LAYOUTS:
        raise ValueError(f"A_LAYOUT must be one of {A_LAYOUTS}, got {a_layout!r}")
    if a_layout == "KM" and precision not in PRECISIONS:
        raise ValueError(f"A_LAYOUT='KM' (an MN-major A) needs 16-bit inputs {PRECISIONS}: "
                         f"{precision} wgmma reads A K-major only (gemmlib.matmul copies a "
                         f"column-major A into row-major order for it)")


def layout_suffix(b_layout: str, a_layout: str = "MK") -> str:
    """What a rung's name gets for A given as (K, M) and B as (N, K): ``wgmma_ws_km_nk``."""
    return ("_km" if a_layout == "KM" else "") + ("_nk" if b_layout == "NK" else "")


def layout_params(b_layout: str, a_layout: str = "MK") -> dict:
    """The ``params`` entries a (K, M) A and an (N, K) B add (MK, KN builds keep their params
    as before)."""
    return ({"A_LAYOUT": a_layout} if a_layout == "KM" else {}) | (
        {"B_LAYOUT": b_layout} if b_layout == "NK" else {})


@cuda.jit(device=True)
def _mk_dims(A):
    return A.shape[0], A.shape[1]


@cuda.jit(device=True)
def _km_dims(A):
    return A.shape[1], A.shape[0]


def a_dims(a_layout: str):
    """``dims(A) -> (M, K)``: the device function that reads the product's M and K off the
    kernel's A, (M, K) or (K, M)."""
    return _km_dims if a_layout == "KM" else _mk_dims


def _k_aligned(spec, M, N, K, dev):
    return K % 8 == 0


def _mk_aligned(spec, M, N, K, dev):
    return M % 8 == 0 and K % 8 == 0


def _mn_aligned(spec, M, N, K, dev):
    return M % 8 == 0 and N % 8 == 0


#: an (N, K) B's rows are K long like A's: only K must be a multiple of 8
K_SIXTEEN_BYTE_ROWS = Constraint(
    "16-byte rows", _k_aligned,
    "TMA copies rows of a multiple of 16 bytes: K must be a multiple of 8 (gemmlib.matmul "
    "pads other shapes)")


#: a (K, M) A's rows are M long: M must be a multiple of 8, and N for a (K, N) B
KM_SIXTEEN_BYTE_ROWS = Constraint(
    "16-byte rows", _mn_aligned,
    "TMA copies rows of a multiple of 16 bytes: with A given as (K, M) and B as (K, N), M and "
    "N must be multiples of 8 (gemmlib.matmul pads or copies other shapes)")
#: ... and K for an (N, K) B
KM_NK_SIXTEEN_BYTE_ROWS = Constraint(
    "16-byte rows", _mk_aligned,
    "TMA copies rows of a multiple of 16 bytes: with A given as (K, M) and B as (N, K), M and "
    "K must be multiples of 8 (gemmlib.matmul pads or copies other shapes)")


def layout_fields(b_layout: str, a_layout: str = "MK") -> dict:
    """The KernelSpec fields a (K, M) A and an (N, K) B change: ``a_operand`` and
    ``b_operand`` (``gemmlib.dispatch`` then passes and maps A as (K, M), B as (N, K)) and
    the shape rule (which of M, N, K are row lengths)."""
    fields = {}
    if a_layout == "KM":
        fields["a_operand"] = "KM"
    if b_layout == "NK":
        fields["b_operand"] = "NK"
    rows = {("MK", "NK"): K_SIXTEEN_BYTE_ROWS, ("KM", "KN"): KM_SIXTEEN_BYTE_ROWS,
            ("KM", "NK"): KM_NK_SIXTEEN_BYTE_ROWS}.get((a_layout, b_layout))
    if rows is not None:
        fields["constraints"] = (HOPPER_ONLY, rows)
    return fields


def layout_ptx(b_layout: str, a_layout: str = "MK") -> tuple:
    """The trans immediates (the last two: trans-a, trans-b) an NK or KM build's wgmma must
    have: trans-b 0 (B read K-major) for NK, trans-a 1 (A read MN-major) for KM."""
    if b_layout != "NK" and a_layout != "KM":
        return ()
    ta, tb = int(a_layout == "KM"), int(b_layout == "KN")
    return (r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.b?f16\.b?f16 [^;]*, "
            rf"1, 1, {ta}, {tb};",)


# --------------------------------------------------------------------------
# The bias epilogue: C = A @ B (+ bias), the bias added in fp32 before the one rounding


def bias_source(BN: int, halves: int) -> str:
    """Source of ``add_bias(acc, bias, t, n0, N)``: thread ``t`` of a warpgroup adds
    ``bias[0, c]`` (as float32: ``to32``) to each of its accumulators of column c, in all
    ``halves`` 64-row slices; a (0, N) bias (no bias) leaves them as they are.

    A thread's columns are the same in every row it holds (``H.accumulator_coords``: pairs
    c, c + 1 at ``n0 + 2 * (lane % 4) + 8 j``), so it reads each bias value once and adds it
    to rows g and g + 8 of every slice.  One loop over j, unrolled by NVVM (a constant
    trip count), so every index of ``acc`` is a constant and ``acc`` stays in registers.
    Columns past N read nothing (their sums are never stored)."""
    R = BN // 2
    lines = ["def add_bias(acc, bias, t, n0, N):",
             "    if bias.shape[0] > 0:              # uniform: a bias was given",
             "        c0 = n0 + 2 * (t % 4)",
             f"        for j in range({BN // 8}):",
             "            c = c0 + 8 * j",
             "            b0 = to32(bias[0, uidx(c)]) if c < N else float32(0.0)",
             "            b1 = to32(bias[0, uidx(c + 1)]) if c + 1 < N else float32(0.0)"]
    for h in range(halves):
        for k in range(4):   # accumulators 4j .. 4j + 3: (g, c), (g, c + 1), (g + 8, c), ...
            i = f"{h * R + k} + 4 * j" if h * R + k else "4 * j"
            lines.append(f"            acc[{i}] += b{k % 2}")
    return "\n".join(lines) + "\n"


@cuda.jit(device=True)
def no_bias(acc, bias, t, n0, N):
    """``BIAS=False``: the accumulators are the result (``bias`` is never read)."""
    return


@cuda.jit(device=True)
def f32_value(x):
    return float32(x)


def bias_code(precision: str, BN: int, halves: int, bias: bool):
    """``add_bias(acc, bias, t, n0, N)`` (:func:`bias_source`) for a bias in ``precision``'s
    input type: fp16 bits through ``cvt.f32.f16``, bf16 bits shifted into a float32's top
    half, tf32's float32 as it is; :func:`no_bias` when the build has none."""
    if not bias:
        return no_bias
    from gemmlib.intrinsics.convert import bf16_to_float, half_to_float

    to32 = {"fp16": half_to_float, "bf16": bf16_to_float}.get(precision, f32_value)
    env = {"to32": to32, "uidx": uidx, "float32": float32}
    return compile_sources((bias_source(BN, halves),), env)[0]


def bias_suffix(bias: bool) -> str:
    """What a rung's name gets for the bias epilogue: ``wgmma_ws_bias``."""
    return "_bias" if bias else ""


def bias_params(bias: bool) -> dict:
    return {"BIAS": True} if bias else {}


def bias_fields(bias: bool) -> dict:
    """``bias_arg``: the kernel takes the bias right after C (``gemmlib.spec``)."""
    return {"bias_arg": True} if bias else {}


def bias_entry(kernel, bias: bool, jit_opts: dict):
    """The kernel a build launches, from ``kernel(A, B, C, bias, *rest)``.

    With a bias: ``kernel`` itself.  Without: a kernel of the argument list the rung had
    before the bias existed, ``(A, B, C, *rest)``, which runs ``kernel``'s body as a device
    function with C in the bias's place -- the no-bias epilogue (:func:`no_bias`) never
    reads it, and NVVM inlines the body, so the code is the kernel's own."""
    if bias:
        return kernel
    py = getattr(kernel, "py_func", None) or kernel.fn     # numba's / the simulator's
    names = list(py.__code__.co_varnames[:py.__code__.co_argcount])
    assert names[:4] == ["A", "B", "C", "bias"], names
    rest = ", ".join(names[4:])
    src = (f"def {py.__name__}(A, B, C, {rest}):\n"
           f"    body(A, B, C, C, {rest})\n")
    ns = {"body": cuda.jit(device=True)(py)}
    exec(compile(src, f"<gemmlib.wgmma {py.__name__}>", "exec"), ns)  # noqa: S102
    return cuda.jit(**jit_opts)(ns[py.__name__])


#: what the wgmma rungs' epilogue may write: float32, or the inputs' own 16-bit type
OUTPUTS = ("fp32", "fp16", "bf16")


def check_out(precision: str, out: str) -> None:
    if out not in OUTPUTS or out not in ("fp32", precision):
        raise ValueError(f"OUT must be 'fp32' or the inputs' own type ({precision!r}); "
                         f"got {out!r}")


def out_store(BN: int, halves: int, precision: str, out: str, env: dict) -> str:
    """The epilogue's source for a C of ``out``: float32 (``store_source``'s default), or
    16-bit bits (uint16) -- each accumulator rounded to nearest even (``cvt.rn.f16.f32`` /
    ``cvt.rn.bf16.f32``) and a thread's two adjacent columns stored as one 4-byte store
    (``store2_u16``; element-wise when N is odd or C is not 4-byte aligned).  Adds the
    names the 16-bit source calls to ``env``."""
    check_out(precision, out)
    if out == "fp32":
        return store_source(BN, halves)
    from gemmlib.intrinsics.convert import float_to_bf16, float_to_half
    from gemmlib.intrinsics.vector import aligned4, store2_u16

    env.update(to16=float_to_half if out == "fp16" else float_to_bf16,
               store2_u16=store2_u16, aligned4=aligned4)
    return store_source(BN, halves, "to16", "store2_u16", "aligned4")


def out_fields(precision: str, out: str) -> dict:
    """The KernelSpec fields a 16-bit ``out`` changes: C's argument dtype (uint16 bits) and
    what the PTX must show (the conversion, the paired 16-bit store)."""
    if out == "fp32":
        return {}
    return dict(arg_dtypes=ARG_DTYPES[precision][:2] + ("uint16",))


def out_ptx(out: str) -> tuple:
    return () if out == "fp32" else (rf"cvt\.rn\.{'f16' if out == 'fp16' else 'bf16'}\.f32",
                                     r"st\.global\.v2\.u16")


def out_suffix(out: str) -> str:
    """What a rung's name gets for a 16-bit C: ``wgmma_ws_o16``, ``wgmma_ws_bf16_o16``."""
    return "" if out == "fp32" else "_o16"


def out_params(out: str) -> dict:
    """The ``params`` entry a 16-bit C adds (float32 builds keep their params as before)."""
    return {} if out == "fp32" else {"OUT": out}


def compile_sources(sources, env: dict) -> tuple:
    """Each generated ``def f(...)`` source compiled as a device function (plain Python in
    the simulator) over the names in ``env`` (plus ``one``, the int32 1 that tells wgmma to
    add into its accumulators); ``f.__source__`` keeps the text for the chapters."""
    from numba import int32

    dev = (lambda f: f) if SIMULATOR else cuda.jit(device=True)
    out = []
    for src in sources:
        ns = dict(env, one=int32(1))
        fname = src.split("(")[0][4:]
        exec(compile(src, f"<gemmlib.wgmma {fname}>", "exec"), ns)  # noqa: S102
        f = dev(ns[fname])
        f.__source__ = src
        out.append(f)
    return tuple(out)


def _aligned(spec, M, N, K, dev):
    return K % 8 == 0 and N % 8 == 0


def _sm90(spec, M, N, K, dev):
    return tuple(dev.compute_capability) == (9, 0)


SIXTEEN_BYTE_ROWS = Constraint(
    "16-byte rows", _aligned,
    "the copies move 16-byte rows: K and N must be multiples of 8 (gemmlib.matmul pads "
    "other shapes)")
HOPPER_ONLY = Constraint(
    "Hopper (sm_90a)", _sm90,
    "wgmma and TMA exist on compute capability 9.0 only (H100, H200); newer GPUs "
    "have other instructions (tcgen05)")


def rung_name(base: str, precision: str | None, default: bool, BM: int, BN: int, STAGES: int,
              GROUP_M: int) -> str:
    """``base`` (fp16, default tiles), ``base_bf16``, then ``_BMxBN_sSTAGES[_gGROUP_M]`` for
    other tiles: the names the wgmma rungs' specs carry (``precision=None``: a rung whose
    base name says its precision, as ``wgmma_tf32``)."""
    name = base + ("" if precision in ("fp16", None) else f"_{precision}")
    if not default:
        name += f"_{BM}x{BN}_s{STAGES}" + (f"_g{GROUP_M}" if GROUP_M != 8 else "")
    return name


def spec_fields(precision: str, module: str) -> dict:
    """The KernelSpec fields the three wgmma rungs share."""
    return dict(chapter="17-hopper", dynamic_shared=True, min_cc=H.MIN_CC,
                dtype=INPUT_DTYPE[precision], arg_dtypes=ARG_DTYPES[precision],
                precision=precision, operand_align=8,
                constraints=(HOPPER_ONLY, SIXTEEN_BYTE_ROWS), module=module)


def build(precision: str = "fp16", BM: int = 128, BN: int = 128, STAGES: int = 4,
          GROUP_M: int = 8) -> KernelSpec:
    if BM % 64 or BN not in H.WGMMA_N or BN % 64 or not 2 <= STAGES <= 8:
        raise ValueError(f"BM must be a multiple of 64, BN a multiple of 64 up to 256 and "
                         f"STAGES 2..8 (BM={BM}, BN={BN}, STAGES={STAGES})")
    HALVES = BM // 64
    k_tile, store_acc = warpgroup_code(precision, BN, HALVES)
    tile_origin = tile_order(BM, BN, GROUP_M)
    NT = 128
    ACC = HALVES * BN // 2
    SA, SB = BM * BK, BK * BN                 # halves per stage
    STAGE = SA + SB
    SHARED = STAGES * STAGE * 2 + 1024        # + room to align the ring to 1024 bytes
    IT_A, IT_B = BM * 8 // NT, BN * 8 // NT   # 16-byte chunks per thread per k-tile
    CPR_B = BN // 8                           # chunks per row of B's tile
    cp16, commit = async_copy.cp_async16, async_copy.cp_async_commit
    wait_tile = async_copy.cp_async_wait_group(STAGES - 2)
    wait0 = H.wgmma_wait(0)
    jit_opts = {} if SIMULATOR else {"launch_bounds": (NT, 1)}

    @cuda.jit(device=True)
    def issue_tile(sm, base, A, B, k0, m0, n0, t, M, N, K):
        """Start the 16-byte copies of the k-tile at ``k0`` into the stage at ``base``,
        each chunk to its swizzled place (zeros past the edges)."""
        c = t % 8                             # A: this thread's chunk of each row
        for i in range(IT_A):
            r = t // 8 + i * (NT // 8)
            ok = m0 + r < M and k0 + 8 * c < K
            cp16(sm, uidx(base + swizzled(r, c)), A, uidx(m0 + r if ok else 0),
                 uidx(k0 + 8 * c if ok else 0), 16 if ok else 0)
        nc = t % CPR_B                        # B: chunk nc of k-rows t // CPR_B + ...
        for i in range(IT_B):
            kr = t // CPR_B + i * (NT // CPR_B)
            ok = k0 + kr < K and n0 + 8 * nc < N
            cp16(sm, uidx(base + SA + (nc // 8) * (BK * 64) + swizzled(kr, nc % 8)), B,
                 uidx(k0 + kr if ok else 0), uidx(n0 + 8 * nc if ok else 0), 16 if ok else 0)

    @cuda.jit(**jit_opts)
    def wgmma_async_kernel(A, B, C):
        sm = cuda.shared.array(0, uint16)     # dynamic: the ring, aligned below
        acc = cuda.local.array(ACC, float32)
        t = cuda.threadIdx.x
        M, K = A.shape
        N = B.shape[1]
        pad = ((1024 - H.smem_addr(sm, 0) % 1024) % 1024) // 2   # the swizzle needs 1024
        ring = H.smem_addr(sm, pad)
        m0, n0 = tile_origin(cuda.blockIdx.x, M, N)
        for e in range(ACC):
            acc[e] = float32(0.0)
        num_k = (K + BK - 1) // BK
        for s in range(STAGES - 1):           # prologue: tiles 0 .. STAGES-2 in flight
            if s < num_k:
                issue_tile(sm, pad + s * STAGE, A, B, s * BK, m0, n0, t, M, N, K)
            commit()
        rd, wt = 0, STAGES - 1
        for kt in range(num_k):
            wait_tile()                       # my copies of tile kt have landed ...
            H.fence_proxy_async()             # ... and are visible to wgmma's proxy
            cuda.syncthreads()                # everyone's; tile kt-1 is no longer read
            if kt + STAGES - 1 < num_k:
                issue_tile(sm, pad + wt * STAGE, A, B, (kt + STAGES - 1) * BK, m0, n0, t,
                           M, N, K)
            commit()
            H.wgmma_fence()
            k_tile(ring + rd * STAGE * 2, ring + (rd * STAGE + SA) * 2, acc)
            H.wgmma_commit()
            wait0()                           # the stage is read: it may be refilled
            rd = rd + 1 if rd + 1 < STAGES else 0
            wt = wt + 1 if wt + 1 < STAGES else 0
        async_copy.cp_async_wait_all()
        store_acc(C, acc, t, m0, n0, M, N)

    def grid(M, N, K):
        return (cdiv(M, BM) * cdiv(N, BN), 1, 1)

    default = (BM, BN, STAGES, GROUP_M) == (128, 128, 4, 8)
    return KernelSpec(
        name=rung_name("wgmma_async", precision, default, BM, BN, STAGES, GROUP_M),
        idea="one warpgroup issues wgmma (64xNx16 from shared-memory descriptors, "
             "asynchronous) on 128-byte swizzled tiles that cp.async fills",
        kernel=wgmma_async_kernel,
        block=(NT, 1, 1),
        tile=(BM, BN),
        grid=grid,
        params=dict(precision=precision, BM=BM, BN=BN, BK=BK, STAGES=STAGES, GROUP_M=GROUP_M),
        shared_bytes=SHARED,
        ptx_must=(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16", r"wgmma\.fence",
                  r"cp\.async\.cg\.shared\.global", r"fence\.proxy\.async"),
        **spec_fields(precision, __name__),
    )


SPEC = build()
