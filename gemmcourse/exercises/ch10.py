"""Answers to chapter 10's exercises: reading and writing layouts."""

from gemmlib import layout as L


def offset(shape=(4, 3), stride=(1, 5), coord=(2, 1)):
    """The offset a layout gives to ``coord``."""
    return L.Layout(shape, stride)(*coord)


def cosize(shape=(4, 3), stride=(1, 5)):
    """One past the largest offset of the layout."""
    return L.Layout(shape, stride).cosize


def padded_layout(shape=(8, 4), pad=2):
    """A row-major tile with ``pad`` unused elements after each row (layouts compare by shape
    and stride, so any spelling of the same layout matches)."""
    return L.padded(shape, pad, major="row")
