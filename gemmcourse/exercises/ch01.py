"""Answers to chapter 1's exercises: the cost of one GEMM."""


def flops(M, N, K):
    """A multiply and an add for every (i, j, k)."""
    return 2 * M * N * K


def bytes_moved(M, N, K, bytes_per_el=4):
    """A and B read once, C written once."""
    return bytes_per_el * (M * K + K * N + M * N)


def intensity(M, N, K, bytes_per_el=4):
    """FLOPs per byte moved when each matrix crosses DRAM once."""
    return flops(M, N, K) / bytes_moved(M, N, K, bytes_per_el)
