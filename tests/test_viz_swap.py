"""gemmcourse.viz_swap (chapter 18.8): the stream-K figure is the kernel's own walk, the
measured figures read the committed sweep as it is, the launch table is ``plan_for``'s, the
exercises' answers are the rung's own functions, and every figure is legible at the book's
width.  No GPU, no kernel launches."""

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from gemmcourse import exercises as ex  # noqa: E402
from gemmcourse import viz, viz_swap as vs  # noqa: E402
from gemmcourse.exercises import ch18  # noqa: E402
from gemmlib.kernels import wgmma_split_k as W  # noqa: E402
from gemmlib.kernels import wgmma_swap as S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "18h-swap-ab.ipynb"


@pytest.fixture(autouse=True)
def _book_style():
    from gemmcourse import notebook as nb

    nb._style_figures()
    yield
    plt.close("all")


def _planned():
    found = vs.planned_file()
    assert found is not None, "no committed swap-*/planned-*.json"
    return found[1]


def _grid():
    found = vs.grid_file()
    assert found is not None, "no committed swap-*/grid-*.json"
    return found[1]


# --------------------------------------------------------------------------
# The tiles


def test_tile_rows_follow_the_rungs_stage_rule():
    rows = vs.tile_rows(16)
    assert [(r["BM"], r["BN"]) for r in rows] == [(128, 256), (64, 256), (64, 16)]
    for r in rows:
        assert r["stages"] == S.stages_for(r["BM"], r["BN"])
        assert r["stage_bytes"] == 2 * S.BK * (r["BM"] + r["BN"])
        assert r["stages"] * r["stage_bytes"] <= S.RING_BYTES
    assert [r["real"] for r in rows] == [16 / 128, 16 / 64, 1.0]
    swap = rows[-1]
    assert swap["stages"] == S.MAX_STAGES and swap["stage_bytes"] == 10 * 1024
    assert swap["weight_in_flight"] == 16 * 8 * 1024
    assert rows[1]["stages"] == 5 and rows[1]["stage_bytes"] == 40 * 1024
    five = vs.tile_rows(5)[-1]
    assert five["BN"] == 8 and five["real"] == 5 / 8
    assert five["tile"].startswith("wgmma_swap, 64 x 8 ")


# --------------------------------------------------------------------------
# Stream-K: the kernel's walk


def _rule_owner(i, G, T):
    return ((i + 1) * G - 1) // T


@pytest.mark.parametrize("tiles, num_k, G", [(6, 8, 5), (3, 5, 4), (7, 12, 10), (1, 1, 1),
                                             (64, 64, 128), (96, 64, 132), (5, 3, 20)])
def test_stream_k_assignment_is_the_kernels_walk(tiles, num_k, G):
    """Every (tile, k-tile) taken by one block, shares within one k-tile of each other, the
    block the owner rule names; each shared tile's pieces numbered 0.. in block order."""
    a = vs.stream_k_assignment(tiles, num_k, G)
    T = tiles * num_k
    for t in range(tiles):
        for k in range(num_k):
            assert a["owner"][t][k] == _rule_owner(t * num_k + k, G, T)
    shares = [sum(k1 - k0 for _, k0, k1, _, _ in a["units"][c]) for c in range(G)]
    assert sum(shares) == T and max(shares) - min(shares) <= 1
    for t, ps in a["pieces"].items():
        assert [p[3] for p in ps] == list(range(len(ps))) and {p[4] for p in ps} == {len(ps)}
        assert [p[0] for p in ps] == sorted(p[0] for p in ps)
    assert max(len(ps) for ps in a["pieces"].values()) == W.stream_k_pieces(tiles, num_k, G)


def test_the_walk_is_not_patched_globally():
    """stream_k_assignment runs the walk with its own cuda namespace: gemmlib's is untouched."""
    before = getattr(W.cuda, "blockIdx", None)
    vs.stream_k_assignment(3, 5, 4)
    assert getattr(W.cuda, "blockIdx", None) is before


def test_pieces_lines_name_the_shared_tiles():
    lines = vs.pieces_lines(6, 8, 5)
    assert lines[0] == "tile 1: 2 pieces: block 0 k-tile 0, block 1 k-tiles 1-7"
    assert len(lines) == 4 and not any(ln.startswith(("tile 0", "tile 5")) for ln in lines)
    assert vs.pieces_lines(4, 8, 4) == [] and vs.pieces_lines(8, 8, 4) == []
    assert vs.pieces_lines(2, 8, 4) == [
        "tile 0: 2 pieces: block 0 k-tiles 0-3, block 1 k-tiles 4-7",
        "tile 1: 2 pieces: block 2 k-tiles 0-3, block 3 k-tiles 4-7"]


# --------------------------------------------------------------------------
# The committed measurements


def test_planned_file_reads_every_layer_and_candidate():
    data = _planned()
    lays = vs.layers(data)
    assert len(lays) == 12 and lays[0] == ("mistral-7b", "qkv", 6144, 4096)
    for cand in ("split64", "swap64", "auto"):
        for M in (1, 16, 64):
            got = vs.pct_by_layer(data, cand, M)
            assert len(got) == 12
            row = next(r for r in data["rows"] if (r["candidate"], r["M"], r["model"],
                                                   r["proj"]) == (cand, M, "qwen2.5-7b", "o"))
            assert got[("qwen2.5-7b", "o")] == row["pct_of_torch"]
            assert row["pct_of_torch"] == pytest.approx(100 * row["torch_us"] / row["median_us"])


def test_summary_is_the_geometric_mean_the_page_states():
    """The numbers of the page's measured-result sentence, from the file."""
    data = _planned()
    s = vs.summary(data)
    stated = {("auto", 1): 83.9, ("auto", 16): 85.1, ("auto", 64): 78.0,
              ("split64", 1): 74.7, ("split64", 16): 74.3, ("split64", 64): 66.7}
    for key, pct in stated.items():
        v = list(vs.pct_by_layer(data, *key).values())
        assert s[key]["n"] == 12
        assert s[key]["gm"] == pytest.approx(math.prod(v) ** (1 / len(v)))
        assert f"{s[key]['gm']:.1f}" == f"{pct:.1f}", key
    text = "\n".join("".join(c["source"]) for c in json.loads(PAGE.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    assert "83.9%, 85.1% and 78.0%" in text and "74.7%, 74.3%\nand 66.7%" in text
    assert all(len(vs.faster(data, "auto", "split64", M)) == 11 for M in (1, 16, 64))


def test_grid_points_average_repeats_and_name_the_cut():
    rows = _grid()
    pts = vs.grid_points(rows, 16, 4096, 4096, 64)
    got = {g: (p, k) for g, p, k in pts}
    assert set(got) == {32, 64, 66, 128, 132}
    twice = [r["pct"] for r in rows if (r["M"], r["N"], r["K"], r["BM"], r["GRID"])
             == (16, 4096, 4096, 64, 128)]
    assert len(twice) == 2 and got[128][0] == pytest.approx(sum(twice) / 2)
    assert got[132][1] == "uneven" and got[128][1] == "even" and got[64][1] == "even"
    assert vs.grid_kind(256, 512) == "waves" and vs.grid_kind(64, 66) == "uneven"
    assert vs.grid_kind(96, 48) == "even" and vs.grid_kind(48, 96) == "even"
    best = vs.best_by_kind(rows)
    assert [(d["N"], d["even"][0]) for d in best] == [(4096, 128), (6144, 96), (16384, 128),
                                                      (3072, 96)]
    gaps = [d["even"][1] - d["uneven"][1] for d in best]
    assert round(min(gaps)) == 9 and round(max(gaps)) == 20       # the page's "9 to 20"


def test_plan_table_is_plan_for_on_an_h100():
    h100 = vs.h100()
    assert h100.sm_count == 132 and round(h100.peak_bandwidth_gbs) == 3352
    table = vs.plan_table(_planned(), M=16, dev=h100)
    assert len(table.rows) == 12
    for (model, proj, N, K), row in zip(vs.layers(_planned()), table.rows):
        BM, g = S.plan_for(16, N, K, h100)
        assert row[2:5] == [str(BM), str(-(-N // BM)), str(g)]
    # the test of the rung itself pins these choices (tests/test_wgmma_swap.py)
    assert S.plan_for(1, 4096, 4096, h100) == (64, 128)
    assert vs.share_text(64, 128, 64) == "tiles in 2 pieces"
    assert vs.share_text(96, 96, 64) == "1 whole tile"
    assert vs.share_text(256, 128, 48) == "2 whole tiles"
    assert vs.share_text(592, 132, 56) == "uneven: 251.2 k-tiles"


def test_helpers_say_nothing_is_committed(tmp_path):
    assert vs.planned_file(tmp_path) is None and vs.grid_file(tmp_path) is None


# --------------------------------------------------------------------------
# Exercises


def test_exercise_answers_are_the_rungs_functions():
    kw = dict(tiles=7, num_k=12, G=10, tile=4)
    pieces = vs.stream_k_assignment(7, 12, 10)["pieces"][4]
    assert ex.expected("ch18.swap_blocks_of_tile", **kw) == len(pieces) == 3
    assert ex.expected("ch18.swap_first_block", **kw) == pieces[0][0] == 5
    for M in (1, 5, 8, 9, 16, 17, 20, 31, 33, 48, 64, 65, 200):
        assert ch18.swap_width(M) == S.width_for(M)
    assert ex.expected("ch18.swap_stages", BM=128, BN=32) == S.stages_for(128, 32) == 10


def test_the_pages_solutions_pass_its_checks(capsys):
    from gemmcourse import notebook as nb

    assert ex.check("ch18.swap_blocks_of_tile", 3, "x", tiles=7, num_k=12, G=10, tile=4)
    assert ex.check("ch18.swap_first_block", 5, "x", tiles=7, num_k=12, G=10, tile=4)
    assert ex.check("ch18.swap_stages", 200 * 1024 // (2 * 64 * (128 + 32)), "x",
                    BM=128, BN=32)

    def my_width(M):                                 # the page's solution
        for w in (8, 16, 32, 64):
            if M <= w:
                return w
        return 64

    cases = [(M,) for M in (1, 5, 8, 9, 16, 17, 20, 31, 33, 48, 64, 65, 200)]
    assert nb.check_function(my_width, ch18.swap_width, cases, "my_width")
    out = capsys.readouterr().out
    assert out.count("[correct]") == 4


def test_the_page_never_prints_an_answer():
    """Neither the page's outputs nor its code show what its exercises ask for."""
    cells = json.loads(PAGE.read_text())["cells"]
    outputs = "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get(
        "text/plain", "")) for c in cells if c["cell_type"] == "code" for o in c["outputs"])
    assert "stages_for(128, 32)" not in outputs and "width_for(20)" not in outputs
    assert "tile 4: 3 pieces" not in outputs
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "stages_for(128" not in code and "stream_k_assignment(7" not in code


# --------------------------------------------------------------------------
# Legible at the book's width


def _check_legible(fig):
    assert fig.dpi == viz.BOOK_DPI
    fig.canvas.draw()
    assert viz.saved_width_px(fig) <= viz.BOOK_WIDTH_PX
    scale = viz.shown_scale(fig)
    small = [(t.get_text(), t.get_fontsize() * scale) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()
             and t.get_fontsize() * scale < viz.MIN_FONT_PT - 1e-6]
    assert not small, small[:5]


@pytest.mark.parametrize("make", [
    lambda: vs.plot_planned(_planned()),
    lambda: vs.plot_planned(_planned(), tokens=(16,)),
    lambda: vs.plot_stream_k(6, 8, 5),
    lambda: vs.plot_stream_k(12, 6, 17),
    lambda: vs.plot_grid(_grid()),
    lambda: vs.plot_grid(_grid(), M=1, BM=128),
], ids=["planned", "planned one M", "stream-k", "stream-k 17 blocks", "grid", "grid bm128"])
def test_figures_are_legible_at_the_books_width(make):
    _check_legible(make())


def test_the_planned_figure_shows_every_layer_and_candidate():
    fig = vs.plot_planned(_planned())
    axes = fig.axes
    assert len(axes) == 3 and [a.get_title() for a in axes] == ["M = 1", "M = 16", "M = 64"]
    assert len(axes[0].get_yticklabels()) == 12
    for ax, M in zip(axes, (1, 16, 64)):
        pts = [tuple(off) for coll in ax.collections for off in coll.get_offsets()]
        assert len(pts) == 36
        want = vs.pct_by_layer(_planned(), "auto", M)[("mistral-7b", "o")]
        assert (pytest.approx(want), 1) in [(x, y) for x, y in pts]


def test_the_stream_k_figure_numbers_every_cell_by_its_block():
    fig = vs.plot_stream_k(6, 8, 5)
    ax = fig.axes[0]
    owner = vs.stream_k_assignment(6, 8, 5)["owner"]
    cells = {(round(t.get_position()[0] - 0.5), round(t.get_position()[1] - 0.5)): t.get_text()
             for t in ax.texts if t.get_text().isdigit()}
    assert len(cells) == 48
    assert all(cells[(k, t)] == str(owner[t][k]) for t in range(6) for k in range(8))
