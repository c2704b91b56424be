"""Chapter 17's exercise answers (Hopper: wgmma, TMA, warp specialisation, the last mile):
references the page's checks call, so that the cells do not show the answer."""

from __future__ import annotations


def b_descriptor(kk: int, BN: int = 128) -> tuple[int, int, int, int]:
    """(start offset from B's tile, LBO, SBO, swizzle bytes) of B's descriptor at k-step
    ``kk``, read from the code ``wgmma_async.mma_source`` generates."""
    from gemmcourse import viz_hopper as vh

    want = {d["kstep"]: (d["offset"], d["lbo"], d["sbo"], d["swizzle"])
            for d in vh.kernel_descriptors(BN=BN, halves=1) if d["operand"] == "B"}
    return want[kk]


def parity(it: int, stages: int, role: str) -> int:
    """The mbarrier parity ``wgmma_ws``'s consumer (on *full*) or producer (on *empty*)
    waits for at the ``it``-th use of the ring."""
    from gemmcourse import viz_hopper as vh

    return vh.expected_parity(it, stages, role)


def max_stages(BN: int, limit: int) -> int:
    """The deepest ring of 128 x BN stages (at most 8) that fits in ``limit`` bytes, as the
    rung's builder computes its shared memory."""
    from gemmcourse import viz_hopper as vh

    return vh.max_stages(128, BN, limit)


def k_per_step(bytes_per_element: int) -> int:
    """The K of one ``wgmma`` (m64nNkK) for inputs of ``bytes_per_element`` bytes, from the
    intrinsics' table."""
    from gemmlib.intrinsics import hopper as H

    by_size = {2: "f16", 4: "tf32", 1: "e4m3"}
    return H.WGMMA_K[by_size[bytes_per_element]]


def l2_bytes(BM: int, BN: int, CM: int) -> int:
    """Bytes one block copies from L2 per 64-deep fp16 k-tile when CM blocks share B."""
    from gemmcourse import viz_hopper as vh

    return vh.l2_bytes_per_ktile(BM, BN, CM)["bytes"]


def stage_offset(r: int, c: int) -> int:
    """Byte offset of element (r, c) of a 16-bit tile in ``wgmma_store``'s staging area."""
    from gemmlib.kernels import wgmma_store

    return wgmma_store.stage_offset("fp16")(r, c)


def b_offset(n: int, k: int, b_layout: str = "NK", BN: int = 128) -> int:
    """Byte offset from the start of B's k-tile of element (n, k) of a 16-bit B, as the copy
    engine lands it with the 128-byte swizzle: one BN x 64 box of an (N, K) B ("NK"), or
    BN/64 panels of 64 k x 64 n of a (K, N) B ("KN")."""
    from gemmcourse import viz_hopper as vh

    return vh.b_tile_offset(n, k, b_layout, BN)
