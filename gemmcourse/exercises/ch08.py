"""Answers to chapter 8's exercises: shared-memory banks."""

from gemmlib import banks


def bank(row=4, col=0, width=128, pad=0):
    """The bank of word (row, col) of a row-major array with ``width + pad`` floats a row."""
    return (row * (width + pad) + col) % 32


def passes(words):
    """Passes of a warp's 4-byte access, one word per lane (the model of gemmlib.banks)."""
    return banks.wavefronts([[w] for w in words])[0]
