# Copied from the session's exp/i13/ for provenance: the script that ran on the H100 (see ../README.md).
"""Issue 13 probe: prove wgmma / TMA / mbarrier from numba on an H100/H200, one case per process.

    python exp/i13/probe.py CASE        (CASE in CASES; "all" runs each in a subprocess)
"""
import os, re, subprocess, sys, time
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
CASES = ("wgmma_noswz_a", "wgmma_noswz_b", "wgmma_swz128", "tma_noswz", "tma_swz128",
         "tma_wgmma")


PTX = os.environ.get("I13_PTX") == "1"   # no GPU: compile each kernel, assemble for sm_90a


class Compiled(Exception):
    pass


def launch(k, blocks, threads, *args):
    if not PTX:
        k[blocks, threads](*args)
        return
    import numba
    from numba import cuda
    from cuda.bindings import nvjitlink
    from gemmlib.ptx import _offline_device
    sig = tuple(numba.typeof(a) for a in args)
    with _offline_device((9, 0)):
        ptx, _ = cuda.compile_ptx(k.py_func, sig, cc=(9, 0))
    ptx = re.sub(r"\.target sm_90\b", ".target sm_90a", ptx)
    opts = ["-arch=sm_90a", "-verbose"]
    h = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "k.ptx")
        try:
            nvjitlink.complete(h)
        finally:
            log = bytearray(nvjitlink.get_error_log_size(h) + nvjitlink.get_info_log_size(h) + 2)
            n = nvjitlink.get_error_log_size(h)
            e = bytearray(n)
            if n:
                nvjitlink.get_error_log(h, e)
            i = bytearray(nvjitlink.get_info_log_size(h))
            nvjitlink.get_info_log(h, i)
            print(e.decode(errors="replace"), i.decode(errors="replace"))
    finally:
        nvjitlink.destroy(h)
    for op in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier.try_wait", "wgmma.fence"):
        if op in ptx:
            print("  PTX has", op)
    raise Compiled()


def main(case):
    from numba import cuda, uint32, uint64, float32, int32, uint16
    if PTX:
        cp = type("xp", (), dict(asarray=staticmethod(np.asarray), zeros=staticmethod(np.zeros)))
    else:
        import cupy as cp
    import hopper as H

    @cuda.jit(device=True)
    def smem_desc(addr, lbo, sbo, swz):
        return (uint64((addr & 0x3FFFF) >> 4) | (uint64((lbo & 0x3FFFF) >> 4) << uint64(16))
                | (uint64((sbo & 0x3FFFF) >> 4) << uint64(32)) | (uint64(swz) << uint64(62)))

    mma8 = H.wgmma_f16(8)
    wait0 = H.wgmma_wait(0)
    rng = np.random.default_rng(1)

    def check(D, ref, what):
        err = float(np.abs(D - ref).max() / np.abs(ref).max())
        ok = err < 1e-3
        print(f"@@ {case}: {what} max rel err {err:.2e} -> {'OK' if ok else 'WRONG'}", flush=True)
        if not ok:
            print("D[:4,:8]\n", D[:4, :8], "\nref[:4,:8]\n", ref[:4, :8])
        return ok

    @cuda.jit(device=True)
    def store_d(D, d0, d1, d2, d3, t):
        w, l = t // 32, t % 32
        g, q = l // 4, l % 4
        D[16 * w + g, 2 * q] = d0
        D[16 * w + g, 2 * q + 1] = d1
        D[16 * w + g + 8, 2 * q] = d2
        D[16 * w + g + 8, 2 * q + 1] = d3

    if case.startswith("wgmma_noswz"):
        # K-major core matrices (8 rows x 16 bytes); kadj / mnadj: byte distance between
        # core matrices adjacent along K / along M (N)
        kadj, mnadj = (128, 256) if case.endswith("a") else (256, 128)
        # the descriptor: LBO = K-adjacent, SBO = MN-adjacent (PTX ISA); case b swaps the
        # *layout* and keeps the rule, so exactly one of a / b may pass if the rule is right
        A = rng.uniform(-1, 1, (64, 16)).astype(np.float16)
        B = rng.uniform(-1, 1, (8, 16)).astype(np.float16)
        KADJ, MNADJ = kadj // 2, mnadj // 2   # in halves

        @cuda.jit
        def k(A, B, D):
            sA = cuda.shared.array(2048, uint16, alignment=1024)
            sB = cuda.shared.array(512, uint16, alignment=1024)
            t = cuda.threadIdx.x
            for e in range(t, 64 * 16, 128):
                m, kk = e // 16, e % 16
                sA[(m // 8) * MNADJ + (kk // 8) * KADJ + (m % 8) * 8 + kk % 8] = A[m, kk]
            for e in range(t, 8 * 16, 128):
                n, kk = e // 16, e % 16
                sB[(n // 8) * MNADJ + (kk // 8) * KADJ + (n % 8) * 8 + kk % 8] = B[n, kk]
            H.fence_proxy_async()
            cuda.syncthreads()
            da = smem_desc(H.smem_addr(sA, 0), kadj, mnadj, 0)
            db = smem_desc(H.smem_addr(sB, 0), kadj, mnadj, 0)
            H.wgmma_fence()
            d = mma8(da, db, int32(1), float32(0), float32(0), float32(0), float32(0))
            H.wgmma_commit()
            wait0()
            store_d(D, d[0], d[1], d[2], d[3], t)

        D = cp.zeros((64, 8), np.float32)
        launch(k, 1, 128, cp.asarray(A.view(np.uint16)), cp.asarray(B.view(np.uint16)), D)
        cp.cuda.runtime.deviceSynchronize()
        return check(cp.asnumpy(D), A.astype(np.float64) @ B.astype(np.float64).T,
                     f"m64n8k16 no swizzle, K-adjacent {kadj} B, MN-adjacent {mnadj} B")

    if case == "wgmma_swz128":
        A = rng.uniform(-1, 1, (64, 64)).astype(np.float16)
        B = rng.uniform(-1, 1, (8, 64)).astype(np.float16)

        @cuda.jit(device=True)
        def swz(r, c):   # 128-byte rows of 64 halves, 16-byte chunk ^= row % 8
            return r * 64 + (((c // 8) ^ (r % 8)) * 8) + c % 8

        @cuda.jit
        def k(A, B, D):
            sA = cuda.shared.array(64 * 64, uint16, alignment=1024)
            sB = cuda.shared.array(8 * 64, uint16, alignment=1024)
            t = cuda.threadIdx.x
            for e in range(t, 64 * 64, 128):
                sA[swz(e // 64, e % 64)] = A[e // 64, e % 64]
            for e in range(t, 8 * 64, 128):
                sB[swz(e // 64, e % 64)] = B[e // 64, e % 64]
            H.fence_proxy_async()
            cuda.syncthreads()
            a0, b0 = H.smem_addr(sA, 0), H.smem_addr(sB, 0)
            c0 = c1 = c2 = c3 = float32(0)
            H.wgmma_fence()
            for kk in range(4):    # k-steps of 16: +32 bytes inside the swizzled rows
                c0, c1, c2, c3 = mma8(smem_desc(a0 + 32 * kk, 16, 1024, 1),
                                      smem_desc(b0 + 32 * kk, 16, 1024, 1), int32(1),
                                      c0, c1, c2, c3)
            H.wgmma_commit()
            wait0()
            store_d(D, c0, c1, c2, c3, t)

        D = cp.zeros((64, 8), np.float32)
        launch(k, 1, 128, cp.asarray(A.view(np.uint16)), cp.asarray(B.view(np.uint16)), D)
        cp.cuda.runtime.deviceSynchronize()
        return check(cp.asnumpy(D), A.astype(np.float64) @ B.astype(np.float64).T,
                     "m64n8k16 x4, 128-byte swizzle, descriptor advanced 32 B per k-step")

    import tmap as T

    if case in ("tma_noswz", "tma_swz128"):
        swizzled = case == "tma_swz128"
        R, Cc = 100, 72                      # global fp16 matrix (row stride 144 B)
        BR, BC = 64, (64 if swizzled else 32)
        X = cp.asarray(rng.uniform(-1, 1, (R, Cc)).astype(np.float16))
        tm = T.tensor_map_2d(X, (BR, BC), swizzle=128 if swizzled else 0)
        x0, y0 = 40, 60                      # partly outside: zeros expected there
        NB = BR * BC

        @cuda.jit
        def k(tmp, out):
            s = cuda.shared.array(64 * 64, uint16, alignment=1024)
            bar = cuda.shared.array(1, uint64, alignment=8)
            t = cuda.threadIdx.x
            b = H.smem_addr(bar, 0)
            if t == 0:
                H.mbarrier_init(b, 1)
                H.fence_mbarrier_init()
            cuda.syncthreads()
            if t == 0:
                H.tensormap_acquire(tmp)
                H.mbarrier_expect_tx(b, NB * 2)
                H.tma_load_2d(H.smem_addr(s, 0), tmp, x0, y0, b)
            while H.mbarrier_try_wait(b, 0) == 0:
                pass
            for e in range(t, NB, cuda.blockDim.x):
                out[e] = s[e]

        out = cp.zeros(NB, np.uint16)
        launch(k, 1, 128, tm.ptr, out)
        cp.cuda.runtime.deviceSynchronize()
        got = cp.asnumpy(out).view(np.float16)
        Xh = cp.asnumpy(X)
        box = np.zeros((BR, BC), np.float16)
        part = Xh[y0:y0 + BR, x0:x0 + BC]
        box[:part.shape[0], :part.shape[1]] = part
        if swizzled:
            want = np.zeros(NB, np.float16)
            for r in range(BR):
                for c in range(BC):
                    want[r * 64 + (((c // 8) ^ (r % 8)) * 8) + c % 8] = box[r, c]
        else:
            want = box.ravel()
        ok = bool((got == want).all())
        print(f"@@ {case}: box {BR}x{BC} at (x={x0}, y={y0}) of {R}x{Cc}, out-of-bounds zero "
              f"fill{', 128B swizzle as chunk ^= row % 8' if swizzled else ''}: "
              f"{'OK' if ok else 'WRONG'} ({int((got != want).sum())} of {NB} differ)", flush=True)
        return ok

    if case == "tma_wgmma":
        M, N, K = 64, 8, 64
        A = cp.asarray(rng.uniform(-1, 1, (M, K)).astype(np.float16))
        B = cp.asarray(rng.uniform(-1, 1, (N, K)).astype(np.float16))
        ta = T.tensor_map_2d(A, (64, 64), swizzle=128)
        tb = T.tensor_map_2d(B, (8, 64), swizzle=128)

        @cuda.jit
        def k(tpa, tpb, D):
            sA = cuda.shared.array(64 * 64, uint16, alignment=1024)
            sB = cuda.shared.array(8 * 64, uint16, alignment=1024)
            bar = cuda.shared.array(1, uint64, alignment=8)
            t = cuda.threadIdx.x
            b = H.smem_addr(bar, 0)
            if t == 0:
                H.mbarrier_init(b, 1)
                H.fence_mbarrier_init()
            cuda.syncthreads()
            if t == 0:
                H.tensormap_acquire(tpa)
                H.tensormap_acquire(tpb)
                H.mbarrier_expect_tx(b, (64 * 64 + 8 * 64) * 2)
                H.tma_load_2d(H.smem_addr(sA, 0), tpa, 0, 0, b)
                H.tma_load_2d(H.smem_addr(sB, 0), tpb, 0, 0, b)
            while H.mbarrier_try_wait(b, 0) == 0:
                pass
            a0, b0 = H.smem_addr(sA, 0), H.smem_addr(sB, 0)
            c0 = c1 = c2 = c3 = float32(0)
            H.wgmma_fence()
            for kk in range(4):
                c0, c1, c2, c3 = mma8(smem_desc(a0 + 32 * kk, 16, 1024, 1),
                                      smem_desc(b0 + 32 * kk, 16, 1024, 1), int32(1),
                                      c0, c1, c2, c3)
            H.wgmma_commit()
            wait0()
            store_d(D, c0, c1, c2, c3, t)

        D = cp.zeros((64, 8), np.float32)
        launch(k, 1, 128, ta.ptr, tb.ptr, D)
        cp.cuda.runtime.deviceSynchronize()
        Ah, Bh = cp.asnumpy(A).astype(np.float64), cp.asnumpy(B).astype(np.float64)
        return check(cp.asnumpy(D), Ah @ Bh.T, "TMA (128B swizzle) + mbarrier -> 4 x wgmma m64n8k16")
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    case = sys.argv[1]
    if case == "all":
        bad = 0
        for c in CASES:
            t0 = time.time()
            r = subprocess.run([sys.executable, __file__, c], capture_output=True, text=True,
                               timeout=120)
            lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "arn" not in ln]
            print(f"--- {c}: rc={r.returncode} ({time.time() - t0:.0f} s)")
            print("\n".join(lines[-25:]), flush=True)
            bad += r.returncode != 0
        sys.exit(bad)
    try:
        sys.exit(0 if main(case) else 1)
    except Compiled:
        print(f"@@ {case}: compiled and assembled for sm_90a")
