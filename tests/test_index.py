"""uidx: the unsigned index cast the coarsened rungs use (gemmlib.intrinsics.index)."""

import pytest

from gemmlib import backend
from gemmlib.intrinsics.index import uidx


def test_uidx_keeps_non_negative_values():
    assert int(uidx(0)) == 0 and int(uidx(12345)) == 12345


@pytest.mark.skipif(not backend.SIMULATOR, reason="checks the simulator's behaviour")
def test_uidx_of_a_negative_index_fails_loudly_in_the_simulator():
    # On the GPU a negative index through uidx would wrap to a huge address; the simulator
    # refuses it, so a kernel bug of that kind fails in CI instead of on someone's GPU.
    with pytest.raises(OverflowError):
        uidx(-1)
