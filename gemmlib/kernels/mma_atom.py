"""One warp, one tensor-core instruction per k-step: the MMA atom, fragment by fragment.

Everything before this rung computed with FMAs on the CUDA cores.  A
tensor-core instruction, ``mma.sync``, is *one* warp-wide instruction that
multiplies a whole 16 x k by k x 8 tile (k = 16 for FP16/BF16, 8 for TF32)
and adds it to a 16 x 8 accumulator: 2048 (FP16) multiply-adds, where an
FMA does one.  This rung is the smallest kernel that uses it:

* a block is one warp and owns one 16 x 8 tile of C (the *atom*);
* per k-step the warp copies A's 16 x k and B's k x 8 piece into shared
  memory (guarded element copies, zeros past the edges: any M, N, K);
* each lane then reads *its* fragment elements from shared memory, one by
  one, at the (row, col) the fragment layout gives for (lane, value) --
  ``gemmlib.intrinsics.mma.A_16`` etc., turned into device functions by
  ``gemmlib.layout`` -- packs them into 32-bit registers and issues the mma;
* at the end each lane writes its four accumulators where ``C_F32`` says.

It is deliberately slow (one warp per SM slot, one instruction between two
barriers); its point is that the whole fragment bookkeeping is visible, and
that the simulator, whose ``mma`` twin assembles the matrices from the same
layouts the PTX ISA defines, checks it.

``precision``: ``"fp16"`` / ``"bf16"`` take 16-bit inputs (passed as their
uint16 bit patterns), ``"tf32"`` takes float32 and rounds each element with
``cvt.rna.tf32.f32``; all accumulate in fp32 and write a float32 C.

``arch``: these instructions need sm_80, except FP16 on sm_75 (Turing, the
T4), which has mma.sync only as m16n8k8.  An m16n8k16 fragment is two m16n8k8
fragments side by side along k, so the ``"sm75"`` form is the same kernel
with one line changed: each k-step issues two m16n8k8 on the same registers
(``gemmlib.intrinsics.mma.mma_f16_sm75``).  By default ``build`` makes the
form of the GPU at hand.
"""

from gemmlib import layout as L
from gemmlib.backend import cuda, float32, uint16, uint32
from gemmlib.intrinsics import mma as I
from gemmlib.intrinsics.index import uidx
from gemmlib.precision import INPUT_DTYPE
from gemmlib.spec import KernelSpec, cdiv

#: kernel argument dtypes (A, B, C) per precision: 16-bit inputs travel as raw bits
ARG_DTYPES = {"fp16": ("uint16", "uint16", "float32"), "bf16": ("uint16", "uint16", "float32"),
              "tf32": ("float32", "float32", "float32"),
              "3xtf32": ("float32", "float32", "float32")}


def fragment_functions(precision: str, device: bool):
    """(row, col) of fragment value ``v`` of ``lane``, generated from the atom's layouts.

    ``a_rc(lane, v)`` indexes the 16 x KA tile of A, ``b_rc`` the KA x 8 tile of
    B and ``c_rc`` the 16 x 8 tile of C (``v`` counts values, two per register
    for 16-bit inputs).
    """
    atom = I.ATOMS["tf32" if precision == "3xtf32" else precision]
    M, N, KA = atom["shape"]
    out = {}
    for name, lay, rows in (("a_rc", atom["A"], M), ("b_rc", atom["B"], KA),
                            ("c_rc", atom["C"], M)):
        # the layout's own generated index function, then offset -> (row, col)
        off = L.jit(lay.source(f"{name}_offset"), device=device)
        src = (f"def {name}(lane, v):\n"
               f"    o = {name}_offset(lane, v)\n"
               f"    return o % {rows}, o // {rows}\n")
        out[name] = L.jit(src, device=device, env={f"{name}_offset": off})
        out[name].__source__ = off.__source__ + src
    return out


def build(precision: str = "fp16", arch: str | None = None) -> KernelSpec:
    """``arch``: ``"sm80"`` or ``"sm75"`` (FP16 only); None: this GPU's
    (``gemmlib.intrinsics.mma.device_arch``)."""
    if precision not in ("fp16", "bf16", "tf32"):
        raise ValueError("mma_atom runs precision 'fp16', 'bf16' or 'tf32' "
                         f"(3xtf32 is the pipeline rung's), got {precision!r}")
    arch = arch or I.device_arch(precision)
    sm75 = arch == "sm75"
    f = fragment_functions(precision, device=True)
    a_rc, b_rc, c_rc = f["a_rc"], f["b_rc"], f["c_rc"]
    KA = I.ATOMS[precision]["shape"][2]   # k of one fragment: 16 or 8
    mma = I.mma_for(precision, arch)      # sm75: two m16n8k8 on the same fragments
    sixteen = precision != "tf32"
    elem = uint16 if sixteen else float32
    zero = elem(0)
    SA, SB = 16 * KA, 8 * KA   # elements of the A and B tiles in shared memory
    VSTEP = 2 if sixteen else 1  # fragment values per 32-bit register

    @cuda.jit(device=True)
    def reg(s, r, c, rows):
        """One 32-bit register of a fragment: two 16-bit values (r, c), (r, c+1) of a
        row-major tile of ``rows`` rows, or one float rounded to TF32."""
        if sixteen:
            lo = uint32(s[uidx(r * rows + c)])
            hi = uint32(s[uidx(r * rows + c + 1)])
            return lo | (hi << uint32(16))
        return I.cvt_tf32(s[uidx(r * rows + c)])

    @cuda.jit(device=True)
    def store(C, m0, n0, lane, v, value, M, N):
        r, c = c_rc(lane, v)
        if m0 + r < M and n0 + c < N:
            C[uidx(m0 + r), uidx(n0 + c)] = value

    @cuda.jit
    def mma_atom_kernel(A, B, C):
        sA = cuda.shared.array(SA, elem)     # 16 x KA, row-major
        sB = cuda.shared.array(SB, elem)     # 8 x KA: B's tile stored n-major (b[n, k])
        lane = cuda.threadIdx.x
        M, K = A.shape
        N = B.shape[1]
        m0 = cuda.blockIdx.x * 16
        n0 = cuda.blockIdx.y * 8
        c0 = c1 = c2 = c3 = float32(0.0)
        for k0 in range(0, K, KA):
            # stage the atom's operands, zeros past the matrix edges
            for e in range(lane, SA, 32):
                r, k = e // KA, e % KA
                ok = m0 + r < M and k0 + k < K
                sA[e] = A[uidx(m0 + r), uidx(k0 + k)] if ok else zero
            for e in range(lane, SB, 32):
                n, k = e // KA, e % KA
                ok = n0 + n < N and k0 + k < K
                sB[e] = B[uidx(k0 + k), uidx(n0 + n)] if ok else zero
            cuda.syncthreads()
            # my fragment, element by element, where the layouts say
            # 16-bit: values 2j and 2j+1 share register j (VSTEP = 2); TF32: one per register
            ra, ca = a_rc(lane, 0)
            a0 = reg(sA, ra, ca, KA)
            ra, ca = a_rc(lane, VSTEP)
            a1 = reg(sA, ra, ca, KA)
            ra, ca = a_rc(lane, 2 * VSTEP)
            a2 = reg(sA, ra, ca, KA)
            ra, ca = a_rc(lane, 3 * VSTEP)
            a3 = reg(sA, ra, ca, KA)
            kb, nb = b_rc(lane, 0)
            b0 = reg(sB, nb, kb, KA)   # sB is n-major: (k, k+1) are neighbours
            kb, nb = b_rc(lane, VSTEP)
            b1 = reg(sB, nb, kb, KA)
            c0, c1, c2, c3 = mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3)
            cuda.syncthreads()
        store(C, m0, n0, lane, 0, c0, M, N)
        store(C, m0, n0, lane, 1, c1, M, N)
        store(C, m0, n0, lane, 2, c2, M, N)
        store(C, m0, n0, lane, 3, c3, M, N)

    def grid(M, N, K):
        return (cdiv(M, 16), cdiv(N, 8), 1)

    return KernelSpec(
        name="mma_atom" if precision == "fp16" else f"mma_atom_{precision}",
        chapter="14-tensor-cores",
        idea="one warp issues one tensor-core mma.sync per k-step; each lane reads its "
             "fragment elements from shared memory at the places the PTX fragment layout gives",
        kernel=mma_atom_kernel,
        block=(32, 1, 1),
        tile=(16, 8),
        grid=grid,
        params=dict(precision=precision, KA=KA, arch=arch),
        shared_bytes=(16 + 8) * KA * (2 if sixteen else 4),
        min_cc=I.MIN_CC_SM75 if sm75 else I.MIN_CC,
        min_cc_why="" if sm75 else I.sm80_reason(precision),
        dtype=INPUT_DTYPE[precision],
        arg_dtypes=ARG_DTYPES[precision],
        precision=precision,
        ptx_must=I.PTX_MUST_SM75 if sm75 else (r"mma\.sync\.aligned\.m16n8k",),
        ptx_must_not=(r"\bld\.local", r"\bst\.local") + (I.PTX_MUST_NOT_SM75 if sm75 else ()),
        index={k: v for k, v in fragment_functions(precision, device=False).items()},
        module=__name__,
    )


SPEC = build()
