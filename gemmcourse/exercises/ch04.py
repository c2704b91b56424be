"""Answers to chapter 4's exercises: sectors touched by a warp."""


def naive16(block_x, block_y, thread_x, thread_y):
    """The naive mapping (threadIdx.x down the rows) with 16 x 16 blocks."""
    return block_x * 16 + thread_x, block_y * 16 + thread_y


def sectors_of_a(M=48, N=48, K=40):
    """Distinct 32-byte sectors of A that warp 0 reads in one step k under naive16."""
    from gemmcourse import viz

    return viz.warp_access(naive16, M, N, K, block=(16, 16))["A"].sectors
