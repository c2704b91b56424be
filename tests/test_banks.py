"""gemmlib.banks: the bank-conflict model, and each rung's conflicts computed from the
kernel's own index functions."""

import pytest

from gemmlib import banks
from gemmlib.kernels import blocktile_2d, get, vectorized


def test_consecutive_words_are_conflict_free():
    words = [[lane] for lane in range(32)]
    assert banks.wavefronts(words) == (1, 1)


def test_broadcast_is_free():
    assert banks.wavefronts([[5]] * 32) == (1, 1)


def test_stride_two_is_two_way():
    words = [[2 * lane] for lane in range(32)]
    assert banks.wavefronts(words) == (2, 1)


def test_same_bank_everywhere_is_32_way():
    assert banks.wavefronts([[32 * lane] for lane in range(32)]) == (32, 1)


def test_float4_quarter_warps():
    # 32 consecutive float4s: 4 phases of 128 contiguous bytes -> ideal
    words = [[4 * lane + e for e in range(4)] for lane in range(32)]
    assert banks.wavefronts(words, width=4) == (4, 4)
    # float4s 32 bytes apart: each quarter-warp spans 256 bytes -> 2-way in each phase
    words = [[8 * lane + e for e in range(4)] for lane in range(32)]
    assert banks.wavefronts(words, width=4) == (8, 4)


def test_width_must_be_1_2_or_4():
    with pytest.raises(ValueError):
        banks.wavefronts([[0, 1, 2]], width=3)


def _degrees(spec):
    return {(r.access.array, r.access.op): r.degree for r in banks.analyze(spec)}


def test_vectorized_has_the_two_conflicts_bank_free_removes():
    v = _degrees(get("vectorized"))
    assert v[("sAT", "store")] == 4.0  # the transposing store: 4 k-groups of 8 rows
    assert v[("sB", "load")] == 2.0  # 8-float-wide thread tiles, read as float4s
    b = _degrees(get("bank_free"))
    assert all(d == 1.0 for d in b.values()), b


def test_each_fix_alone_removes_its_conflict():
    swizzle_only = _degrees(vectorized.build(SWIZZLE=True))
    assert swizzle_only[("sAT", "store")] == 1.0 and swizzle_only[("sB", "load")] == 2.0
    split_only = _degrees(vectorized.build(SPLIT=True))
    assert split_only[("sAT", "store")] == 4.0 and split_only[("sB", "load")] == 1.0


def test_padding_fixes_the_store_for_bk8_but_not_for_bk16():
    assert _degrees(vectorized.build(BK=8))[("sAT", "store")] == 2.0
    assert _degrees(vectorized.build(BK=8, PAD=4))[("sAT", "store")] == 1.0
    for pad in (4, 8, 12, 16):  # rows must stay 16-byte aligned: pads are multiples of 4
        assert _degrees(vectorized.build(BK=16, PAD=pad))[("sAT", "store")] >= 2.0


def test_blocktile_2d_interleaved_vs_contiguous_thread_tiles():
    assert all(d == 1.0 for d in _degrees(get("blocktile_2d")).values())
    c = _degrees(blocktile_2d.build(CONTIGUOUS=True))
    assert c[("sB", "load")] == 4.0 and c[("sA", "load")] == 2.0


def test_predict_matches_ncu():
    # Nsight Compute on an H200 at 512^3 (results/tuning/README.md): vectorized with BK=8
    # had 262,144 shared-load instructions and 524,288 load bank conflicts, 32,768 store
    # conflicts; the double-buffered warptile (BK=16, padded, unswizzled) 32,768 store
    # conflicts and none on loads -- exactly what the model predicts.
    p = banks.predict(vectorized.build(BK=8, max_registers=None), 512, 512, 512)
    assert p["ld_instructions"] == 262_144
    assert p["ld_conflicts"] == 524_288
    assert p["st_conflicts"] == 32_768
    from gemmlib.kernels import warptile

    old = warptile.build(BM=128, BN=128, BK=16, WM=64, WN=32, WNITER=2, TM=4, TN=4, PAD=4,
                         SWIZZLE=False)
    q = banks.predict(old, 512, 512, 512)
    assert q["ld_conflicts"] == 0 and q["st_conflicts"] == 32_768
    assert banks.predict(get("bank_free"), 512, 512, 512)["ld_conflicts"] == 0
    assert banks.predict(get("warptile"), 512, 512, 512)["st_conflicts"] == 0


def test_report_names_every_access():
    text = banks.report(get("warptile"))
    assert "sAT" in text and "sB" in text and "-way" in text


def test_bank_map_covers_the_warp():
    acc = banks.accesses(get("bank_free"))[3]
    m = banks.bank_map(acc)
    assert len(m) == 32 and all(len(b) == 4 for b in m)
