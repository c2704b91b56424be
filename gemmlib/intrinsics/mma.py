"""Tensor cores from Python: ``mma.sync``, ``ldmatrix`` and ``cvt.rna.tf32.f32``.

A tensor-core instruction is *warp-wide*: the 32 threads of a warp together
hold one small matrix product, ``D (16 x 8) = A (16 x k) @ B (k x 8) + C``,
with every thread holding a few elements of each operand in its registers
(its *fragment*).  Which thread holds which element is fixed by the PTX ISA
("warp-level matrix fragments"); the layouts below write those maps down as
:class:`gemmlib.layout.Layout` objects, ``(lane, value) -> element``, with
``lane = t + 4 * g`` (``t = lane % 4`` the thread in its group of four,
``g = lane // 4`` the group):

=====================  ====================  ==========================================
instruction            operand (registers)   layout: (lane, value) -> offset
=====================  ====================  ==========================================
m16n8k8 TF32           A 16 x 8   (4 x b32)  ``A_TF32``: m + 16 k
                       B 8 x 8    (2 x b32)  ``B_TF32``: k + 8 n
m16n8k16 FP16 / BF16   A 16 x 16  (4 x b32,  ``A_16``:   m + 16 k
                       two halves each)
                       B 16 x 8   (2 x b32)  ``B_16``:   k + 16 n
m16n8k8 FP16 (sm_75)   A 16 x 8   (2 x b32)  ``A_16_K8``: m + 16 k
                       B 8 x 8    (1 x b32)  ``B_16_K8``: k + 8 n
all                    C, D 16 x 8 (4 f32)   ``C_F32``:  m + 16 n
=====================  ====================  ==========================================

For 16-bit inputs a register packs two values, the lower-numbered value in
its low half.  TF32 values travel as the 32-bit pattern of a float whose low
13 mantissa bits the hardware ignores (``cvt_tf32`` rounds them away).

``ldmatrix`` loads whole fragments from shared memory in one instruction:
each of 1, 2 or 4 8x8 matrices of 16-bit elements is given by eight *row
addresses* (lanes 0-7 give matrix 0's rows, 8-15 matrix 1's, ...), and lane
``l`` receives, of matrix ``j``, the two elements of row ``l // 4`` at
columns ``2 (l % 4)`` and ``+1`` -- exactly an m16n8k16 A or B fragment.
``.trans`` delivers the transposed matrix (row ``2 (l % 4)`` and ``+1`` at
column ``l // 4``), which reads a B stored k-major as the fragment wants it.

Functions (inside ``@cuda.jit`` kernels; registers are ``uint32``):

``mma_f16(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``
    m16n8k16, FP16 inputs, fp32 accumulate; ``mma_bf16`` the same for BF16
``mma_tf32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3) -> (d0, d1, d2, d3)``
    m16n8k8, TF32 inputs, fp32 accumulate
``ldmatrix_x1/x2/x4(smem, i)`` and ``ldmatrix_x1/x2/x4_trans(smem, i)``
    this lane's row address is ``&smem[i]`` (16-byte aligned); returns 1, 2 or
    4 registers (x1 returns one ``uint32``, the others a tuple)
``mma_f16_k8(a0, a1, b0, c0, c1, c2, c3) -> (d0, d1, d2, d3)``
    m16n8k8, FP16 inputs, fp32 accumulate: the FP16 instruction of sm_75 (Turing,
    the T4); ``mma_f16_sm75`` has ``mma_f16``'s signature and issues two of them
``cvt_tf32(x) -> uint32``
    ``x`` rounded to TF32, to nearest with ties away from zero (``.rna``)
``as_float(u) -> float32`` / ``as_bits(x) -> uint32``
    reinterpret the 32 bits (free: no instruction)

Every function has a plain-Python twin for numba's simulator that follows
the fragment layouts above element by element: the twins of the warp-wide
instructions gather all 32 lanes' registers (a barrier per warp), build the
matrices from the layouts and hand each lane its own part of the result.  A
kernel whose fragment index math is wrong therefore computes a wrong product
in CI, not only on a GPU.
"""

from __future__ import annotations

import copy
import threading

import numpy as np

from gemmlib.backend import SIMULATOR
from gemmlib.layout import Layout

#: compute capability of mma.sync m16n8k16 BF16, m16n8k8 TF32 (and cp.async)
MIN_CC = (8, 0)

# --------------------------------------------------------------------------
# Fragment layouts (PTX ISA, "matrix fragments for mma.m16n8k8 / m16n8k16")

#: TF32 A, 16 x 8: value v = (row + 8, col + 4) -> a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3
A_TF32 = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))
#: TF32 B, 8 x 8: b0 (k = t, n = g), b1 (k = t + 4, n = g)
B_TF32 = Layout(((4, 8), 2), ((1, 8), 4))
#: FP16/BF16 A, 16 x 16: value v = (col + 1, row + 8, col + 8); register r holds values 2r, 2r+1
A_16 = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))
#: FP16/BF16 B, 16 x 8: value v = (k + 1, k + 8), n = g
B_16 = Layout(((4, 8), (2, 2)), ((2, 16), (1, 8)))
#: C and D, 16 x 8 fp32: value v = (col + 1, row + 8)
C_F32 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))

#: (M, N, K) of one instruction and the layouts of its operands, per input type
ATOMS = {
    "tf32": dict(shape=(16, 8, 8), A=A_TF32, B=B_TF32, C=C_F32),
    "fp16": dict(shape=(16, 8, 16), A=A_16, B=B_16, C=C_F32),
    "bf16": dict(shape=(16, 8, 16), A=A_16, B=B_16, C=C_F32),
}

#: FP16 m16n8k8 (sm_75), A 16 x 8: a0, a1 (row g; k 2t, 2t + 1), a2, a3 (row g + 8), as C
A_16_K8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
#: FP16 m16n8k8 (sm_75), B 8 x 8: b0, b1 (k = 2t, 2t + 1; n = g)
B_16_K8 = Layout(((4, 8), 2), ((2, 8), 1))
#: the sm_75 FP16 atom, by the name its simulator twin uses (not a precision: not in ATOMS)
ATOM_F16_K8 = dict(shape=(16, 8, 8), A=A_16_K8, B=B_16_K8, C=C_F32, input="fp16")


def _atom(kind: str) -> dict:
    return ATOM_F16_K8 if kind == "fp16_k8" else ATOMS[kind]


def fragment_coords(layout: Layout, rows: int):
    """``[[(row, col) of value v for v ...] for lane in 0..31]`` of a fragment layout
    whose offsets are column-major in a matrix with ``rows`` rows."""
    nv = layout.size // 32
    return [[divmod(layout((lane % 4, lane // 4), v), rows)[::-1] for v in range(nv)]
            for lane in range(32)]


# --------------------------------------------------------------------------
# Scalar bit conversions (host and simulator)


def _f32(bits) -> float:
    return float(np.array([int(bits) & 0xFFFFFFFF], np.uint32).view(np.float32)[0])


def _bits(x) -> int:
    return int(np.array([x], np.float32).view(np.uint32)[0])


def cvt_tf32_py(x) -> int:
    """fp32 -> TF32 bits, round to nearest, ties away from zero (NaN and Inf kept)."""
    u = _bits(x)
    if (u >> 23) & 0xFF == 0xFF:
        return u
    return ((u + 0x1000) & 0xFFFFE000) & 0xFFFFFFFF


def as_float_py(u):
    return np.float32(_f32(u))


def as_bits_py(x) -> int:
    return _bits(x)


def _half(bits16: int, kind: str) -> float:
    if kind == "fp16":
        return float(np.array([bits16], np.uint16).view(np.float16)[0])
    return _f32(bits16 << 16)  # bf16: the top half of a float


def _values(reg: int, kind: str) -> list[float]:
    """The values one register carries (two halves, or one TF32)."""
    reg = int(reg) & 0xFFFFFFFF
    if kind == "tf32":
        return [_f32(reg & 0xFFFFE000)]  # the hardware reads only the top 19 bits
    return [_half(reg & 0xFFFF, kind), _half(reg >> 16, kind)]


# --------------------------------------------------------------------------
# Simulator: warp-wide exchange


class FragmentError(RuntimeError):
    """An mma/ldmatrix the GPU would reject or a warp that does not converge (simulator)."""


_registry_lock = threading.Lock()


def _exchange(value, width: int = 32, once=None):
    """Give ``value`` to the other lanes of this warp; return all 32, by lane.

    Every lane of the warp must call it (as on the GPU, where mma and ldmatrix
    are ``.sync.aligned``: all 32 threads execute the same instruction).
    ``width=128`` exchanges within a warpgroup (four consecutive warps: wgmma).
    One wait per lane and round (:class:`_Exchange`), not a two-phase
    ``threading.Barrier``: every wake-up of a simulated thread costs a GIL hand-off,
    and the barrier's two phases made the tensor-core rungs' simulation about half
    waiting.

    ``once``: a function of the round's values, called by the last lane to arrive before
    any lane goes on (the warp's product of an mma, computed once instead of by every
    lane); the values are then returned as ``(values, once(values))``.
    """
    t = threading.current_thread()
    mgr = getattr(t, "_manager", None)
    if mgr is None:
        raise FragmentError("warp-wide intrinsics run only inside a (simulated) kernel")
    bx, by, bz = mgr._block_dim
    if (bx * by * bz) % width:
        raise FragmentError(f"a block of {bx * by * bz} threads has a partial "
                            f"{'warp' if width == 32 else 'warpgroup'}")
    warp, lane = divmod(t.thread_id, width)
    key = (tuple(t.blockIdx), warp, width)
    with _registry_lock:
        table = mgr.__dict__.setdefault("_gemmlib_warps", {})
        slot = table.get(key)
        if slot is None:
            slot = table[key] = _Exchange(width)
    return slot.swap(lane, value, once), lane


class _Exchange:
    """One warp's (or warpgroup's) meeting point: each round, every lane leaves its value and
    waits until the last lane has; all then read the same list (a new one every round, so a
    lane may start the next round while others still read this one).

    The waiting lanes queue on the round's gate, a lock held until the last lane arrives and
    releases it; each lane then takes it and hands it on.  So the lanes wake one after another
    instead of all at once competing for the GIL, and no Condition is made per wait."""

    def __init__(self, width):
        self.width, self.lock = width, threading.Lock()
        self._new_round()

    def _new_round(self):
        self.values, self.count = [None] * self.width, 0
        self.gate = threading.Lock()
        self.gate.acquire()
        self.result = []   # once's (ok, value or exception) of this round

    def swap(self, lane, value, once=None):
        with self.lock:
            values, gate, result = self.values, self.gate, self.result
            values[lane] = value
            self.count += 1
            last = self.count == self.width
            if last:   # the round is complete
                self._new_round()
        if last:
            if once is not None:
                try:
                    result.append((True, once(values)))
                except Exception as e:
                    result.append((False, e))
            gate.release()
        elif gate.acquire(timeout=120):
            gate.release()
        else:
            raise FragmentError(f"not all {self.width} threads of the "
                                f"{'warp' if self.width == 32 else 'warpgroup'} reached the "
                                "collective instruction (divergent control flow around "
                                "mma/ldmatrix/wgmma)")
        if once is None:
            return list(values)
        ok, out = result[0]
        if not ok:   # every lane raises it (a copy each: one traceback per thread)
            raise (out if last else copy.copy(out))
        return list(values), out


_TABLES: dict = {}


def _tables(kind: str):
    """Flat matrix index of every (lane, value) of A, B and C, as NumPy arrays (cached)."""
    t = _TABLES.get(kind)
    if t is None:
        atom = _atom(kind)
        m, n, k = atom["shape"]

        def flat(layout, rows, cols, row_major_cols):
            idx = np.empty((32, layout.size // 32), dtype=np.int64)
            for lane in range(32):
                for v in range(idx.shape[1]):
                    col, row = divmod(layout((lane % 4, lane // 4), v), rows)
                    idx[lane, v] = row * row_major_cols + col
            return idx

        t = _TABLES[kind] = (flat(atom["A"], m, k, k), flat(atom["B"], k, n, n),
                             flat(atom["C"], m, n, n))
    return t


def _decode(regs, kind: str) -> np.ndarray:
    """(32, r) uint32 registers -> (32, values) float64, in value order."""
    u = np.asarray(regs, dtype=np.uint64).astype(np.uint32)
    if kind == "tf32":
        return (u & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    h = u.view(np.uint16).reshape(u.shape[0], -1)   # little-endian: low half first
    if kind == "fp16":
        return h.view(np.float16).astype(np.float64)
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _mma_py(kind: str, a, b, c):
    atom = _atom(kind)
    m, n, k = atom["shape"]
    ia, ib, ic = _tables(kind)

    def product(regs):   # the warp's, once
        A = np.zeros(m * k)
        B = np.zeros(k * n)
        A[ia] = _decode([r[0] for r in regs], atom.get("input", kind))
        B[ib] = _decode([r[1] for r in regs], atom.get("input", kind))
        return A.reshape(m, k) @ B.reshape(k, n)

    (_, D), lane = _exchange((tuple(int(x) for x in a), tuple(int(x) for x in b)),
                             once=product)
    return tuple(np.float32(np.float64(c[v]) + D.flat[ic[lane, v]]) for v in range(4))


def mma_f16_py(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _mma_py("fp16", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))


def mma_bf16_py(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _mma_py("bf16", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))


def mma_tf32_py(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    return _mma_py("tf32", (a0, a1, a2, a3), (b0, b1), (c0, c1, c2, c3))


def _ldmatrix_py(num: int, trans: bool, smem, i):
    flat = np.asarray(smem).reshape(-1)
    if flat.dtype.itemsize not in (2, 4):
        raise FragmentError(f"ldmatrix reads 16-bit data; got a {flat.dtype} array")
    if trans and flat.dtype.itemsize != 2:
        raise FragmentError("ldmatrix .trans transposes 16-bit elements: use a 16-bit array")
    byte = int(i) * flat.dtype.itemsize
    if byte % 16:
        raise FragmentError(f"ldmatrix row address {byte} (element {int(i)}) is not "
                            f"16-byte aligned")
    rows, lane = _exchange(byte)
    h = flat.view(np.uint16)

    def elem(row_byte, col):  # 16-bit element ``col`` of the 16-byte row at ``row_byte``
        if row_byte is None:
            raise FragmentError("a lane that supplies a row address did not reach ldmatrix")
        return int(h[row_byte // 2 + col])

    out = []
    for j in range(num):
        g, t = lane // 4, lane % 4
        if trans:   # row 2t and 2t+1 of matrix j, column g
            lo, hi = elem(rows[8 * j + 2 * t], g), elem(rows[8 * j + 2 * t + 1], g)
        else:       # row g of matrix j, columns 2t and 2t+1
            lo, hi = elem(rows[8 * j + g], 2 * t), elem(rows[8 * j + g], 2 * t + 1)
        out.append(lo | (hi << 16))
    return out[0] if num == 1 else tuple(out)


def _twin(num, trans):
    def f(smem, i):
        return _ldmatrix_py(num, trans, smem, i)
    f.__name__ = f"ldmatrix_x{num}{'_trans' if trans else ''}_py"
    return f


ldmatrix_x1_py, ldmatrix_x2_py, ldmatrix_x4_py = (_twin(n, False) for n in (1, 2, 4))
ldmatrix_x1_trans_py, ldmatrix_x2_trans_py, ldmatrix_x4_trans_py = (
    _twin(n, True) for n in (1, 2, 4))


# --------------------------------------------------------------------------
# The intrinsics (GPU)


def _make_intrinsics():
    from llvmlite import ir
    from numba import types
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    from gemmlib.intrinsics._lower import shared_address

    i32, f32 = ir.IntType(32), ir.FloatType()

    def _mma(name, ptx_types, k):
        ptx = (f"mma.sync.aligned.m16n8k{k}.row.col.f32.{ptx_types}.{ptx_types}.f32 "
               "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")

        def typer(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            for v in (a0, a1, a2, a3, b0, b1):
                if not isinstance(v, types.Integer):
                    raise NumbaTypeError(f"{name}: A and B fragments are uint32 registers, "
                                         f"got {v}")
            for v in (c0, c1, c2, c3):
                if not isinstance(v, (types.Float, types.Integer)):
                    raise NumbaTypeError(f"{name}: C fragments are float32, got {v}")
            sig = types.UniTuple(types.float32, 4)(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)

            def codegen(context, builder, sig, args):
                regs = [context.cast(builder, v, t, types.uint32)
                        for v, t in zip(args[:6], sig.args[:6])]
                accs = [context.cast(builder, v, t, types.float32)
                        for v, t in zip(args[6:], sig.args[6:])]
                ret = ir.LiteralStructType([f32] * 4)
                fnty = ir.FunctionType(ret, [i32] * 6 + [f32] * 4)
                asm = ir.InlineAsm(fnty, ptx, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
                out = builder.call(asm, regs + accs)
                vals = [builder.extract_value(out, e) for e in range(4)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        typer.__name__ = name
        return intrinsic(typer)

    def _ldmatrix(num, trans):
        name = f"ldmatrix_x{num}{'_trans' if trans else ''}"
        regs = ",".join(f"${e}" for e in range(num))
        ptx = (f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16 "
               f"{{{regs}}}, [${num}];")

        def typer(typingctx, smem, i):
            if not (isinstance(smem, types.Array) and smem.ndim == 1):
                raise NumbaTypeError(f"{name}: smem must be a 1-D shared array, got {smem}")
            if not isinstance(i, types.Integer):
                raise NumbaTypeError(f"{name}: the index must be an integer, got {i}")
            ret = types.uint32 if num == 1 else types.UniTuple(types.uint32, num)
            sig = ret(smem, i)

            def codegen(context, builder, sig, args):
                addr = shared_address(context, builder, sig.args[0], args[0], args[1],
                                      sig.args[1])
                rty = i32 if num == 1 else ir.LiteralStructType([i32] * num)
                fnty = ir.FunctionType(rty, [i32])
                cons = ",".join(["=r"] * num) + ",r,~{memory}"
                asm = ir.InlineAsm(fnty, ptx, cons, side_effect=True)
                out = builder.call(asm, [addr])
                if num == 1:
                    return out
                vals = [builder.extract_value(out, e) for e in range(num)]
                return context.make_tuple(builder, sig.return_type, vals)

            return sig, codegen

        typer.__name__ = name
        return intrinsic(typer)

    @intrinsic
    def cvt_tf32(typingctx, x):
        sig = types.uint32(x)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            asm = ir.InlineAsm(ir.FunctionType(i32, [f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            return builder.call(asm, [v])

        return sig, codegen

    @intrinsic
    def as_float(typingctx, u):
        sig = types.float32(u)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.uint32)
            return builder.bitcast(v, f32)

        return sig, codegen

    @intrinsic
    def as_bits(typingctx, x):
        sig = types.uint32(x)

        def codegen(context, builder, sig, args):
            v = context.cast(builder, args[0], sig.args[0], types.float32)
            return builder.bitcast(v, i32)

        return sig, codegen

    out = dict(mma_f16=_mma("mma_f16", "f16", 16), mma_bf16=_mma("mma_bf16", "bf16", 16),
               mma_tf32=_mma("mma_tf32", "tf32", 8), cvt_tf32=cvt_tf32, as_float=as_float,
               as_bits=as_bits)
    for num in (1, 2, 4):
        for trans in (False, True):
            out[f"ldmatrix_x{num}{'_trans' if trans else ''}"] = _ldmatrix(num, trans)
    return out


_NAMES = ("mma_f16", "mma_bf16", "mma_tf32", "cvt_tf32", "as_float", "as_bits",
          "ldmatrix_x1", "ldmatrix_x2", "ldmatrix_x4",
          "ldmatrix_x1_trans", "ldmatrix_x2_trans", "ldmatrix_x4_trans")

if SIMULATOR:
    _impl = {n: globals()[f"{n}_py"] for n in _NAMES}
else:
    _impl = _make_intrinsics()

mma_f16, mma_bf16, mma_tf32 = _impl["mma_f16"], _impl["mma_bf16"], _impl["mma_tf32"]
cvt_tf32, as_float, as_bits = _impl["cvt_tf32"], _impl["as_float"], _impl["as_bits"]


# --------------------------------------------------------------------------
# The 3xTF32 split: x = big + small, non-finite values keeping fp32 semantics
#
# 3xTF32 forms a*b as small_a*big_b + big_a*small_b + big_a*big_b.  With
# big = cvt.rna(x) and small = cvt.rna(x - big), two kinds of input break it:
#
# * NaN/+-Inf: small = Inf - Inf = NaN, and an Inf big meets the other
#   factor's small part, exactly 0 for every value TF32 holds (Inf*0 = NaN) or
#   of either sign.  SGEMM's Inf row times a finite column is +-Inf; this gave
#   NaN.  So a non-finite x travels in the *small* part: small = x, big = +-1
#   (x's sign).  Then for a*b with a non-finite, small_a*big_b is a*b as fp32
#   has it (Inf*big_b: +-Inf, or NaN where b = 0; NaN*anything = NaN), and
#   the other two terms hold +-1 times finite values -- finite, so they cannot
#   turn that +-Inf into NaN.  Both factors +-Inf: the two cross terms are the
#   same +-Inf.  Only the small parts ever carry Inf or NaN.
# * near FLT_MAX: cvt.rna.tf32.f32 is integer arithmetic on the bits (ptxas
#   emits, for sm_80 and sm_90, ``|x| < Inf ? u + 0x1000 : u``, then
#   ``& 0xFFFFE000``), and the carry of ``+ 0x1000`` reaches the exponent for
#   every finite |x| >= 3.40199e38 (bits 0x7F7FF000): big = Inf, small = -Inf.
#   The split rounds those toward zero instead, big and small alike: big =
#   +-3.40116e38 (the largest TF32), small the remainder (< 2**117) truncated,
#   so |big + small| <= |x| (rounded to nearest, small could bring big + small
#   to 2**128, past FLT_MAX) and |x - big - small| < 2**-21 |x|.
#
# Subnormals: the bit arithmetic rounds them on TF32's grid (spacing 2**-136,
# no flush to zero), so big = 0 only for |x| < 2**-137 -- where such an x
# times Inf gives 0*Inf = NaN, not SGEMM's +-Inf.

_TF32_MASK = np.uint32(0xFFFFE000)
_TF32_HALF = np.uint32(0x1000)        # half a TF32 ulp, in the bits
_SIGN_ONE = np.uint32(0xBF800000)     # u & this: +-1.0 for any NaN/Inf bit pattern u
#: the smallest |x| that cvt.rna.tf32 rounds up to Inf (bits 0x7F7FF000)
RNA_TF32_OVERFLOW = np.float32(np.uint32(0x7F7FF000).view(np.float32))   # 3.40199e38
_F32_INF = np.float32(np.inf)
_TF32_RZ_REST = np.float32(2.0 ** 116)   # |x - big| below this unless big was truncated


def split_tf32_py(x):
    """``x`` (float32) -> ``(big, small)``, TF32 bit patterns (uint32), for 3xTF32.

    Finite x: ``big`` = x to nearest, ties away (``cvt.rna``), and ``small`` =
    the remainder ``x - big`` (exact in fp32) rounded the same way; for |x| >=
    3.40199e38, where that would give Inf, both toward zero.  NaN/+-Inf:
    ``big`` = +-1.0 and ``small`` = x - big = x, so that ``small_a*big_b +
    big_a*small_b + big_a*big_b`` has the NaN/+-Inf of a*b.  Nine instructions
    (cvt.rna twice and a subtraction, what it replaces, are seven).
    """
    u = as_bits(x)
    # half a TF32 ulp added before the low 13 bits are cleared rounds to nearest, ties
    # away (cvt.rna); nothing added rounds toward zero: at 3.40199e38 and up, and NaN/Inf
    big = np.uint32(((u + _TF32_HALF) if abs(x) < RNA_TF32_OVERFLOW else u) & _TF32_MASK)
    if not abs(x) < _F32_INF:
        big = np.uint32(u & _SIGN_ONE)                  # NaN/Inf: big = +-1 ...
    d = x - as_float(big)            # ... so small = x: Inf - 1 = Inf; else the exact rest
    # |d| <= 2**116 except after a truncated big (and NaN/Inf): those round toward zero.
    # (The test on d, not x, leaves ptxas room: no spill in mma_pipeline's 3xtf32 tiles.)
    r = as_bits(d)
    return big, np.uint32(((r + _TF32_HALF) if abs(d) < _TF32_RZ_REST else r) & _TF32_MASK)


if SIMULATOR:
    split_tf32 = split_tf32_py
else:
    from gemmlib.backend import cuda as _cuda_split

    split_tf32 = _cuda_split.jit(device=True)(split_tf32_py)
ldmatrix_x1, ldmatrix_x2, ldmatrix_x4 = (_impl[f"ldmatrix_x{n}"] for n in (1, 2, 4))
ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans = (
    _impl[f"ldmatrix_x{n}_trans"] for n in (1, 2, 4))

#: the MMA instruction per input precision ("3xtf32" issues mma_tf32 three times)
MMA = {"fp16": mma_f16, "bf16": mma_bf16, "tf32": mma_tf32, "3xtf32": mma_tf32}


# --------------------------------------------------------------------------
# sm_75 (Turing: the T4 of Colab)
#
# Turing's tensor cores take FP16 only, and mma.sync only as m16n8k8; ldmatrix is
# sm_75 too.  m16n8k16 FP16, BF16, TF32 (and cp.async) arrive with sm_80.  An
# m16n8k16 fragment *is* two m16n8k8 fragments side by side along k: A's a0, a1
# and B's b0 hold k 0-7, a2, a3 and b1 hold k 8-15 (compare A_16_K8 with A_16).
# So a rung keeps its m16n8k16 fragments and loads on sm_75 and swaps only the
# instruction: ``mma_f16_sm75`` issues the two m16n8k8.

#: compute capability of the sm_75 forms: m16n8k8 FP16 and ldmatrix
MIN_CC_SM75 = (7, 5)
#: PTX an sm_75 form must (not) contain: the Turing instruction, nothing of sm_80's
PTX_MUST_SM75 = (r"mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.f16\.f16\.f32",)
PTX_MUST_NOT_SM75 = (r"m16n8k16", r"cp\.async")


def mma_f16_k8_py(a0, a1, b0, c0, c1, c2, c3):
    return _mma_py("fp16_k8", (a0, a1), (b0,), (c0, c1, c2, c3))


def _make_mma_f16_k8():
    from llvmlite import ir
    from numba import types
    from numba.cuda.core.errors import NumbaTypeError
    from numba.cuda.extending import intrinsic

    i32, f32 = ir.IntType(32), ir.FloatType()
    ptx = ("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
           "{$0,$1,$2,$3}, {$4,$5}, {$6}, {$7,$8,$9,$10};")

    @intrinsic
    def mma_f16_k8(typingctx, a0, a1, b0, c0, c1, c2, c3):
        for v in (a0, a1, b0):
            if not isinstance(v, types.Integer):
                raise NumbaTypeError(f"mma_f16_k8: A and B fragments are uint32 registers, "
                                     f"got {v}")
        for v in (c0, c1, c2, c3):
            if not isinstance(v, (types.Float, types.Integer)):
                raise NumbaTypeError(f"mma_f16_k8: C fragments are float32, got {v}")
        sig = types.UniTuple(types.float32, 4)(a0, a1, b0, c0, c1, c2, c3)

        def codegen(context, builder, sig, args):
            regs = [context.cast(builder, v, t, types.uint32)
                    for v, t in zip(args[:3], sig.args[:3])]
            accs = [context.cast(builder, v, t, types.float32)
                    for v, t in zip(args[3:], sig.args[3:])]
            fnty = ir.FunctionType(ir.LiteralStructType([f32] * 4), [i32] * 3 + [f32] * 4)
            asm = ir.InlineAsm(fnty, ptx, "=f,=f,=f,=f,r,r,r,f,f,f,f")
            out = builder.call(asm, regs + accs)
            vals = [builder.extract_value(out, e) for e in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen

    return mma_f16_k8


mma_f16_k8 = mma_f16_k8_py if SIMULATOR else _make_mma_f16_k8()


def _two_k8(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """m16n8k16 FP16 as sm_75 computes it: two m16n8k8 on the same registers."""
    d0, d1, d2, d3 = mma_f16_k8(a0, a1, b0, c0, c1, c2, c3)   # k 0-7
    return mma_f16_k8(a2, a3, b1, d0, d1, d2, d3)             # k 8-15


def mma_f16_sm75_py(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    d = mma_f16_k8_py(a0, a1, b0, c0, c1, c2, c3)
    return mma_f16_k8_py(a2, a3, b1, *d)


if SIMULATOR:
    mma_f16_sm75 = mma_f16_sm75_py
else:
    from gemmlib.backend import cuda as _cuda

    mma_f16_sm75 = _cuda.jit(device=True)(_two_k8)


def arch_for(precision: str, cc) -> str:
    """The form of a tensor-core rung that a GPU of compute capability ``cc`` runs:
    ``"sm75"`` for FP16 below sm_80 (two m16n8k8 per m16n8k16), else ``"sm80"``
    (BF16, TF32 and 3xTF32 exist from sm_80 on only)."""
    return "sm75" if precision == "fp16" and tuple(cc) < MIN_CC else "sm80"


def device_arch(precision: str) -> str:
    """``arch_for`` the current device (the simulator's is sm_90); ``"sm80"`` with no
    device at all (offline compiles, such as the compile gate, name their target)."""
    from gemmlib import backend

    if not (backend.SIMULATOR or backend.gpu_present()):
        return "sm80"
    return arch_for(precision, backend.device_info().compute_capability)


def mma_for(precision: str, arch: str):
    """The mma (``mma_f16``'s signature) that a rung built for ``arch`` issues."""
    if arch == "sm80":
        return MMA[precision]
    if arch == "sm75" and precision == "fp16":
        return mma_f16_sm75
    if arch == "sm75":
        raise ValueError(f"{precision} has no sm_75 form: {sm80_reason(precision)}")
    raise ValueError(f"arch must be 'sm80' or 'sm75', got {arch!r}")


def sm80_reason(precision: str) -> str:
    """Why the ``precision`` form of a tensor-core rung needs sm_80 (for ConstraintError)."""
    if precision == "fp16":
        return ("this build issues mma.sync m16n8k16 with fp16 inputs, new in sm_80 (Ampere); "
                "the rung's sm_75 form (build(arch='sm75'): two m16n8k8 per m16n8k16) runs on "
                "a T4, and gemmlib.matmul picks it there")
    return (f"tensor cores take {precision.replace('3x', '')} inputs from sm_80 (Ampere) on; "
            "an sm_75 GPU such as the T4 multiplies fp16 only: pass float16 inputs, or "
            "compute in fp32 on the CUDA cores (precision='fp32')")


_SM75_NAMES = ["mma_f16_k8", "mma_f16_k8_py", "mma_f16_sm75", "mma_f16_sm75_py", "A_16_K8",
               "B_16_K8", "MIN_CC_SM75", "arch_for", "device_arch", "mma_for", "sm80_reason"]

__all__ = list(_NAMES) + ["MMA", "ATOMS", "A_TF32", "B_TF32", "A_16", "B_16", "C_F32",
                          "fragment_coords", "MIN_CC", "FragmentError"] + [
    f"{n}_py" for n in _NAMES] + _SM75_NAMES


# --------------------------------------------------------------------------
# A warp shuffle with a simulator twin (numba's simulator has no shfl_*_sync)


def shfl_xor_f32_py(value, mask, members):
    """The float32 ``value`` of lane ``lane ^ mask`` of this warp.  ``members``: the lanes
    that take part (all 32, or the first n of a block of n < 32 threads), every one of which
    must call."""
    t = threading.current_thread()
    mgr = getattr(t, "_manager", None)
    n = 32
    if mgr is not None:
        bx, by, bz = mgr._block_dim
        n = min(32, bx * by * bz)
    if int(members) != (0xFFFFFFFF if n == 32 else (1 << n) - 1):
        raise FragmentError(f"shfl members {int(members):#x} are not the warp's {n} threads")
    values, lane = _exchange(value, n)
    return np.float32(values[lane ^ int(mask)])


if SIMULATOR:
    shfl_xor_f32 = shfl_xor_f32_py
else:
    from gemmlib.backend import cuda as _cuda_shfl

    @_cuda_shfl.jit(device=True)
    def shfl_xor_f32(value, mask, members):
        """``shfl.sync.bfly.b32`` among the lanes ``members``: lane ``lane ^ mask``'s value."""
        return _cuda_shfl.shfl_xor_sync(members, value, mask)

__all__ += ["shfl_xor_f32", "shfl_xor_f32_py"]
