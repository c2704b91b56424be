"""The Hopper tuner's pieces that need no GPU: classes, the table rule, candidates' specs."""

import pytest

from gemmlib import tune_hopper as T
from gemmlib import backend, tuning
from gemmlib.runtime import select as S


def test_token_classes_and_the_nearest_one():
    assert tuning.token_class(300, 4096, 14336) == "m256-n4096-k16384"
    tuned = ["m256-n4096-k4096", "m512-n4096-k16384", "m256-n8192-k16384"]
    # tokens weigh twice: the same M at twice the outputs beats twice the tokens
    assert tuning.nearest_class("m256-n4096-k16384", tuned) == "m256-n8192-k16384"
    # the older classes (sqrt(MN), K) are never mixed with token classes
    assert tuning.nearest_class("mn4096-k4096", tuned) is None


def test_training_models_are_held_apart_from_the_suites():
    from gemmlib.bench_models import MODELS as models_suite
    from gemmlib.bench_serving import MODELS as serving

    assert not set(T.TRAINING) & (set(serving) | set(models_suite))
    shapes = T.layer_shapes()
    assert len({(N, K) for _, N, K in shapes}) == len(shapes)
    assert "gemma-2-2b qkv" in {u for u, _, _ in shapes}


def test_table_keeps_the_rule_unless_a_candidate_leads_it():
    def row(M, N, cand, pct):
        return dict(M=M, N=N, K=4096, candidate=cand, pct_torch=pct)

    rows = [row(128, 4096, "rule", 60), row(128, 4096, "swap64x128", 80),
            row(128, 3900, "rule", 60), row(128, 3900, "swap64x128", 75),
            row(512, 4096, "rule", 80), row(512, 4096, "split128x128s4", 81),
            row(1024, 4096, "rule", 70), dict(M=1024, N=4096, K=4096, candidate="swap64x256",
                                              error="wrong result")]
    t = T.table(rows)
    assert t["m128-n4096-k4096"]["candidate"] == "swap64x128"
    assert t["m128-n4096-k4096"]["layers"] == 2 and t["m128-n4096-k4096"]["grid"] == "even"
    assert t["m512-n4096-k4096"]["candidate"] == "rule"       # within the margin
    assert t["m1024-n4096-k4096"]["candidate"] == "rule"


@pytest.mark.parametrize("name", [n for n in T.CANDIDATES if n != "rule"])
def test_every_candidate_builds_for_a_prefill_chunk(name):
    M, N, K = 256, 4096, 4096
    spec = S.hopper_candidate(T.CANDIDATES[name], "bf16", M, N, K, "NK")
    assert spec is not None and spec.params["precision"] == "bf16"
    if T.CANDIDATES[name].get("grid") == "even":
        from gemmlib.kernels.wgmma_swap import even_counts

        tiles = -(-N // spec.params["BM"]) * -(-M // spec.params["BN"])
        assert spec.params["GRID"] in even_counts(tiles, K, 10 ** 6)


def test_tune_refuses_without_a_hopper_gpu(capsys):
    from gemmlib.cli import main

    assert main(["tune"]) == 2
    assert "H100 or H200" in capsys.readouterr().out


@pytest.fixture
def hopper_table(monkeypatch):
    """An H100-sized GPU (132 SMs) outside the simulator whose tuning table answers every
    class with the entry given: ``hopper_table(entry)`` (None: no table)."""
    from dataclasses import replace

    dev = replace(backend.device_info(), sm_count=132, simulated=False)
    monkeypatch.setattr(backend, "device_info", lambda device_id=None: dev)
    monkeypatch.setattr(S, "SIMULATOR", False)

    def table(entry):
        monkeypatch.setattr(S.tuning, "best_entry",
                            lambda *a, **k: None if entry is None else dict(entry))
        S._CHOICES.clear()

    yield table
    S._CHOICES.clear()


def test_fitted_output_widths_serve_a_k_major_weight_only(hopper_table):
    """A tuned ``fit_n`` entry (tiles of any multiple of 8 outputs): a K-major B (``W.t()``)
    gets it, a (K, N) B the rule (its copies come in 64-column panels)."""
    from gemmlib.kernels.wgmma_split_k import fit_columns

    entry = dict(T.CANDIDATES["split128xfit"], candidate="split128xfit")
    hopper_table(entry)
    M, N, K = 512, 4608, 3584
    assert S.tuned_hopper("bf16", M, N, K) is None
    spec = S.select_tc("bf16", M, N, K, out="bf16", b_layout="NK")
    BN = fit_columns(M, N, K, 128, 132)
    assert spec.b_operand == "NK" and spec.params["BN"] == BN and BN % 8 == 0
    assert -(-M // 128) * -(-N // BN) <= 132     # one wave
    assert spec.params.get("OUT") == "bf16"


def test_past_the_table_whole_wave_tiles_where_wide_ones_leave_a_wave_empty(hopper_table):
    """Past HOPPER_TUNED_MMAX a K-major B takes whole-wave tiles where 128 x 256 ones fill
    too little of their last wave (1024 x 4608: 144 tiles on 132 SMs), and the rule where
    they fill it (1024 x 4096: 128 tiles; 4096 x 4096: 512); a (K, N) B always the rule."""
    hopper_table(None)
    fit = S.select_tc("bf16", 1024, 4608, 3584, out="bf16", b_layout="NK")
    assert fit.b_operand == "NK" and fit.params["BN"] not in (128, 256)
    assert -(-1024 // 128) * -(-4608 // fit.params["BN"]) <= 2 * 132
    for M, N in ((1024, 4096), (4096, 4096), (1024, 4608)):
        rule = S.select_tc("bf16", M, N, 3584, out="bf16")      # a (K, N) B
        assert rule.params.get("BN", 256) == 256, (M, N)
    for M, N in ((1024, 4096), (4096, 4096)):
        assert S.select_tc("bf16", M, N, 3584, out="bf16", b_layout="NK").params.get(
            "BN", 256) == 256, (M, N)


def test_a_class_that_keeps_the_rule_still_fits_a_nearly_empty_last_wave(hopper_table):
    """Within the table (M <= HOPPER_TUNED_MMAX) a class whose entry is the rule: a K-major
    B takes whole-wave tiles where 128 x 256 ones would leave their last wave nearly empty
    (512 x 9216: 144 tiles on 132 SMs), and the rule where they fill it (512 x 8192: 128)."""
    hopper_table(dict(rung="rule"))
    fit = S.select_tc("bf16", 512, 9216, 3072, out="bf16", b_layout="NK")
    assert fit.b_operand == "NK" and fit.params["BN"] not in (128, 256)
    assert -(-512 // 128) * -(-9216 // fit.params["BN"]) <= 2 * 132
    rule = S.select_tc("bf16", 512, 8192, 3072, out="bf16", b_layout="NK")
    assert rule.params.get("BN", 256) == 256


def test_fit_columns_fills_whole_waves():
    """The widths cuBLAS's own kernels take at these shapes (results/ncu-serving-2026-11-27/):
    96 at 256 x 6144, 112 at 512 x 3584, 128 at 512 x 4096 -- tiles of 128 tokens."""
    from gemmlib.kernels.wgmma_split_k import fit_columns

    assert fit_columns(256, 6144, 4096, 128, 132) == 96
    assert fit_columns(512, 3584, 18944, 128, 132) == 112
    assert fit_columns(512, 4096, 4096, 128, 132) == 128
    entry = T.CANDIDATES["split128xfit"]
    for N in (2048, 3584, 4608, 6144, 9216, 16384):   # widths 64 to 256
        p = S.hopper_candidate(entry, "bf16", 512, N, 4096, "NK").params
        assert 2 <= p["STAGES"] <= 8 and p["STAGES"] * 128 * (128 + p["BN"]) <= 200 * 1024


def test_a_tuned_fixed_tile_that_spills_into_a_nearly_empty_wave_is_fitted(hopper_table):
    """A class's fixed tile (64 x 128, whole K) where it would spill into a wave it barely
    fills (128 x 9216: 144 tiles on 132 SMs): a K-major B takes whole-wave tiles instead;
    where the same tile stays within one wave (128 x 6144: 96 tiles) the table's choice."""
    entry = dict(T.CANDIDATES["split64x128s8"], candidate="split64x128s8")
    hopper_table(entry)
    fit = S.select_tc("bf16", 128, 9216, 3072, out="bf16", b_layout="NK")
    tiles = -(-128 // fit.params["BM"]) * -(-9216 // fit.params["BN"])
    assert fit.params["BN"] != 128 and tiles <= 132, fit.params
    kept = S.select_tc("bf16", 128, 6144, 3072, out="bf16", b_layout="NK")
    assert (kept.params["BM"], kept.params["BN"]) == (64, 128)
