"""Chapter 18's exercise answers (the GEMMs inside a model): the values and reference
functions the page's checks use, so that its cells do not show them."""

from __future__ import annotations


def decode_bytes(M: int, N: int, K: int, **_) -> int:
    """Fewest bytes of an M x N x K product: fp16 A and B read once, fp32 C written once."""
    return 2 * (M * K + K * N) + 4 * M * N


def decode_us(M: int, N: int, K: int, dram_gbps: float, **_) -> float:
    """Microseconds those bytes take at ``dram_gbps``."""
    return 1e6 * decode_bytes(M, N, K) / (dram_gbps * 1e9)


def n_tiles(M: int, N: int, BM: int = 128, BN: int = 256, **_) -> int:
    """BM x BN tiles of an M x N output."""
    from gemmcourse import viz_models as vm

    return vm.tiles(M, N, BM, BN)


def n_waves(M: int, N: int, sms: int, BM: int = 128, BN: int = 256, **_) -> int:
    """Waves of those tiles, one tile per SM at a time."""
    from gemmcourse import viz_models as vm

    return vm.waves(n_tiles(M, N, BM, BN), sms)


def filled(M: int, N: int, sms: int, BM: int = 128, BN: int = 256, **_) -> float:
    """Share of the SM-rounds that hold a tile."""
    from gemmcourse import viz_models as vm

    return vm.wave_efficiency(n_tiles(M, N, BM, BN), sms)


def splits(M: int, N: int, sms: int) -> int:
    """The largest split factor whose blocks fit in one wave (128 x 256 tiles)."""
    from gemmcourse import viz_models as vm

    return vm.one_wave_splits(M, N, sms)


def ridge_tokens(N: int, K: int, ridge: float) -> int:
    """The fewest tokens at which a T x N x K product reaches ``ridge`` FLOP per byte."""
    from gemmcourse import viz_models as vm

    return vm.ridge_tokens(N, K, ridge)


def workspace_bytes(M: int, N: int, K: int, S: int, BM: int) -> int:
    """Bytes of ``wgmma_split_k``'s partial sums and ticket counters."""
    from gemmcourse import viz_models as vm

    return vm.split_k_workspace_bytes(M, N, K, S, BM)


def step_us(products: int, others: int, product_host_us: float, other_host_us: float,
            gpu_us: float, replay_us: float, graphs: bool) -> float:
    """Microseconds of one decode step in chapter 18.7's simple model: eagerly, the larger
    of the host's launches and the GPU's work; as a graph, one replay and then the GPU's
    work."""
    if graphs:
        return replay_us + gpu_us
    return max(products * product_host_us + others * other_host_us, gpu_us)


def early_step_us(products: int, gpu_us: float, replay_us: float, seam_us: float,
                  hidden: float) -> float:
    """Microseconds of one decode step replayed as a graph when each product launched early
    hides the share ``hidden`` of the ``seam_us`` that separates it from the kernel before
    it (that kernel's drain, then its own blocks placed and set up)."""
    return replay_us + gpu_us - products * seam_us * hidden


# --------------------------------------------------------------------------
# Chapter 18.8: swap-AB and stream-K (gemmlib.kernels.wgmma_swap)


def swap_blocks_of_tile(tiles: int, num_k: int, G: int, tile: int) -> int:
    """How many blocks share tile ``tile`` in a stream-K launch of ``G`` blocks over
    ``tiles`` tiles of ``num_k`` k-tiles: the kernel's own walk, run block by block."""
    from gemmcourse import viz_swap as vs

    return len(vs.stream_k_assignment(tiles, num_k, G)["pieces"][tile])


def swap_first_block(tiles: int, num_k: int, G: int, tile: int) -> int:
    """The block that takes tile ``tile``'s first k-tile in the same launch."""
    from gemmcourse import viz_swap as vs

    return vs.stream_k_assignment(tiles, num_k, G)["owner"][tile][0]


def swap_width(M: int) -> int:
    """The token width (wgmma's n) ``wgmma_swap`` runs M tokens in."""
    from gemmlib.kernels.wgmma_swap import width_for

    return width_for(M)


def swap_stages(BM: int, BN: int) -> int:
    """The ring depth ``wgmma_swap`` builds for BM weight rows and BN tokens per tile."""
    from gemmlib.kernels.wgmma_swap import stages_for

    return stages_for(BM, BN)
