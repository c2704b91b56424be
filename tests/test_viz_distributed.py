"""Chapter 19's helpers (gemmcourse.viz_distributed) and what its two pages say about the
committed multi-GPU measurements.

Chapter 19 is two pages: ``19-distributed`` (the algorithms, the model of overlap, the CPU run
and the exercises) and ``19b-measured`` (the GPU measurements).  The measured page's prose states
results that its cells compute from results/distributed-*.json; the tests here recompute each
stated number and each claim ("faster in every configuration", "5 of the 6") from the same
files, so that a new run that changes them fails here until the prose is updated.  The first
page's model and opening read the same files.  The exercise answers of gemmcourse.exercises.ch19
are checked against what the page computed before they moved there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "chapters" / "19-distributed.ipynb"          # the algorithms, the exercises
MEASURED = ROOT / "chapters" / "19b-measured.ipynb"        # the GPU measurements

vd = pytest.importorskip("gemmcourse.viz_distributed")


def _cells(page: Path) -> list:
    return json.loads(page.read_text())["cells"]


def _prose(page: Path = MEASURED) -> str:
    return "\n".join("".join(c["source"]) for c in _cells(page) if c["cell_type"] == "markdown")


def _say(text: str) -> str:
    """Prose with its line breaks folded, for phrases that wrap."""
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def runs():
    files = vd.distributed_files()
    if not files:
        pytest.skip("no committed multi-GPU measurement")
    return {d["meta"]["processes"]: d for _, d in files}


@pytest.fixture(scope="module")
def prose():
    """The measured page's prose, where the measured claims are."""
    return _say(_prose(MEASURED))


@pytest.fixture(scope="module")
def algorithms_prose():
    """The first page's prose: the model, the opening, the exercises."""
    return _say(_prose(PAGE))


# --------------------------------------------------------------------------
# The committed files, as the page reads them


def test_files_are_the_runs_not_the_block(runs):
    assert sorted(runs) == [2, 4]
    assert all("allgather_bandwidth" in d for d in runs.values())
    assert [d["meta"]["processes"] for _, d in vd.block_files()] == [2, 4]


def test_the_page_reads_its_own_gpu_and_the_others_apart():
    """The page describes the runs of one GPU (vd.PAGE_GPU); another GPU's committed runs are
    read with gpu=, never mixed into the page's tables and sentences."""
    assert {d["meta"]["gpu"] for _, d in vd.distributed_files() + vd.block_files()} == {
        vd.PAGE_GPU}
    every = vd.distributed_files(gpu=None)
    for gpu in {d["meta"]["gpu"] for _, d in every}:
        files, blocks = vd.distributed_files(gpu=gpu), vd.block_files(gpu=gpu)
        assert {d["meta"]["gpu"] for _, d in files + blocks} == {gpu}
        assert len({d["meta"]["processes"] for _, d in files}) == len(files)
        t = vd.scaling_table(files, "weak")
        assert gpu in t.caption and len(t.rows) == 4 * len(files)
        assert all(sum(c.endswith(" *") for c in row[2:]) == 1 for row in t.rows)
        if blocks:
            assert gpu in vd.block_table(blocks).caption
    assert len(every) == sum(len(vd.distributed_files(gpu=g))
                             for g in {d["meta"]["gpu"] for _, d in every})


def test_way_of_each_row(runs):
    d = runs[4]
    ways = {vd.way(r) for r in d["rows"]}
    assert ways == set(vd.WAYS) | {None}
    r = next(r for r in d["rows"] if r["algorithm"] == "summa" and r["engine"] == "gemmlib"
             and r["options"].get("pipelined"))
    assert vd.way(r) == "nccl overlap"
    best = vd.best_rows(d)
    for (sc, alg, w), r in best.items():
        assert all(o["median_ms"] >= r["median_ms"] for o in d["rows"] if o["dtype"] == "fp16"
                   and (o["scaling"], o["algorithm"], vd.way(o)) == (sc, alg, w))


def test_tables_draw_from_the_files(runs):
    files = vd.distributed_files()
    for scaling in ("weak", "strong"):
        t = vd.scaling_table(files, scaling)
        assert len(t.rows) == 8 and len(t.header) == 2 + len(vd.WAYS)
        assert all(sum(c.endswith(" *") for c in row[2:]) == 1 for row in t.rows)
    b = vd.block_table(vd.block_files())
    assert len(b.rows) == 4 and all("%" in c for row in b.rows for c in row[3:])


# --------------------------------------------------------------------------
# What the prose says, recomputed


def test_the_target_was_missed(runs, prose):
    for P, d in runs.items():
        best = vd.best_rows(d)
        effs = [r["efficiency"] for (sc, _, w), r in best.items()
                if sc == "weak" and w in ("nccl overlap", "copy", "direct")]
        assert max(effs) < 0.9, f"{P} GPUs reached 90%: the page says the target was missed"
    assert "It was missed" in prose and "below 90% on both" in prose
    assert all("below the 90% aimed for" in f for f in vd.findings(vd.distributed_files())[:2])


def test_the_spread_between_runs(runs, prose):
    """'the copy transport's all-gather of A has measured from X% to Y% on 2 GPUs and from ... on
    4': the committed runs and the logs of the benchmark's runs on the page's GPU."""
    said = []
    for P in (2, 4):
        pat = re.compile(rf"fp16 weak scaling on {P} GPUs, gather_A with overlap: ([\d.]+)% "
                         r">= 90% \(\{'transport': 'copy'")
        logs = [log.read_text() for log in ROOT.glob(f"results/distributed-*/bench-x{P}*.log")]
        seen = [float(m.group(1)) for text in logs if f"{P} x {vd.PAGE_GPU}: " in text
                for m in pat.finditer(text)]
        committed = vd.best_rows(runs[P])[("weak", "gather_A", "copy")]["efficiency"]
        seen.append(float(f"{100 * committed:.1f}"))
        assert max(seen) < 90
        said.append(f"from {min(seen):.1f}% to {max(seen):.1f}% on {P}")
    assert f"has measured {said[0]} GPUs and {said[1]}, but no run reached" in prose


def _copy_against_the_others(runs):
    """Over every run, 1-D and row-parallel configuration: whether copy engines beat NCCL
    overlapped, whether direct reads were slower than copies, and (weak scaling) whether
    torch.matmul + NCCL beat the copy engines."""
    copy_wins, direct_slower, torch_weak = [], [], []
    for d in runs.values():
        best = vd.best_rows(d)
        for sc in ("weak", "strong"):
            for alg in ("gather_A", "gather_B", "reduce_scatter"):
                c = best[(sc, alg, "copy")]["median_ms"]
                copy_wins.append(c < best[(sc, alg, "nccl overlap")]["median_ms"])
                direct_slower.append(best[(sc, alg, "direct")]["median_ms"] > c)
                if sc == "weak":
                    torch_weak.append(best[(sc, alg, "torch")]["median_ms"] < c)
    return copy_wins, direct_slower, torch_weak


def test_copy_engines_against_nccl_torch_and_direct(runs, prose):
    copy_wins, direct_slower, torch_weak = _copy_against_the_others(runs)
    assert all(copy_wins) and "faster in every 1-D and row-parallel configuration" in prose
    assert all(direct_slower) and "slower than copies everywhere" in prose
    assert f"was faster in {sum(torch_weak)} of the {len(torch_weak)} weak-scaling" in prose
    strong = vd.best_rows(runs[4])[("strong", "gather_A", "copy")]["efficiency"]
    assert f"it reached {100 * strong:.1f}% on 4 GPUs" in prose
    assert max(r["efficiency"] for (sc, *_), r in vd.best_rows(runs[4]).items()
               if sc == "strong") == strong


def test_summa_was_the_slowest_at_weak_scaling(runs, prose):
    for d in runs.values():
        best = vd.best_rows(d)
        fastest = {alg: min(r["median_ms"] for (sc, a, _), r in best.items()
                            if sc == "weak" and a == alg) for alg in vd.ALGORITHMS}
        assert max(fastest, key=fastest.get) == "summa"
    assert "SUMMA was the slowest algorithm at weak scaling" in prose


def test_the_measured_timeline(runs, prose):
    d = runs[4]
    best = vd.best_rows(d)
    keys = [vd.timeline_key("fp16", "weak", "gather_A", best[("weak", "gather_A", w)]["options"])
            for w in ("nccl", "nccl overlap", "copy")]
    rows = {row[0]: [float(v) if v != "-" else None for v in row[1:]]
            for row in vd.timeline_breakdown(d, keys, ["plain", "nccl", "copy"])}
    first, own, other, busy, _, returns = range(6)
    nccl, copy, plain = rows["nccl"], rows["copy"], rows["plain"]
    assert 1.8 <= nccl[own] / nccl[other] <= 2.2, "the page says: twice as long"
    assert "takes twice as long as each later product" in prose
    assert copy[own] < nccl[own] and copy[first] > nccl[first]
    one = vd.single_ms(d)
    assert 4 * copy[other] <= 1.02 * one and 4 * nccl[other] <= 1.02 * one
    assert all(r[returns] > one for r in (plain, nccl, copy))
    assert "most of the time saved on the gather is spent again" in prose
    saved = best[("weak", "gather_A", "nccl")]["median_ms"] - \
        best[("weak", "gather_A", "nccl overlap")]["median_ms"]
    from gemmlib.distributed import summarize

    gather = median(s["comm_ms"] for s in summarize(d["timelines"][keys[0]]))
    assert 0 < saved < gather / 2


def test_the_tensor_parallel_layer(prose):
    rows = {(d["meta"]["processes"], r["phase"], r["engine"]): r
            for _, d in vd.block_files() for r in d["rows"] if "tok_s" in r}
    for P, phase in ((2, "prefill"), (4, "prefill"), (2, "decode"), (4, "decode")):
        assert f"{rows[(P, phase, 'gemmlib copy')]['pct_torch']:.1f}%" in prose
    for P in (2, 4):
        assert f"{rows[(P, 'prefill', 'torch async-TP')]['pct_torch']:.1f}%" in prose
        assert rows[(P, "prefill", "torch async-TP")]["pct_torch"] < 100
    for phase in ("prefill", "decode"):
        for eng in ("gemmlib nccl", "gemmlib copy"):
            assert rows[(4, phase, eng)]["median_ms"] > rows[(2, phase, eng)]["median_ms"]
            assert rows[(2, phase, eng)]["pct_torch"] < 100
    assert "With 4 GPUs its layer took longer than with 2" in prose


def test_the_model_and_the_opening(runs, prose, algorithms_prose):
    """The model of overlap and the first exercise are on the measured page, the 12 ms of
    one H200 in the chapter's opening."""
    bw, _ = vd.link_bandwidth()
    t = vd.model_times("gather_A", 8192, 4 * 8192, 8192, 4, "fp16", busbw_gbs=bw)
    assert 0.15 <= 1 - t["efficiency_serial"] <= 0.25 and "about a fifth" in prose
    assert t["efficiency_overlapped"] > 0.995 and "hides the all-gather completely" in prose
    cublas = [r["median_ms"] for d in runs.values() for r in d["single"]
              if r["engine"] == "cublas" and r["dtype"] == "fp16" and r["scaling"] == "strong"]
    assert all(11.5 <= ms <= 12.5 for ms in cublas) and "in about 12 ms" in algorithms_prose
    assert f"At the {bw:.0f} GB/s" in prose


def test_the_measured_page_states_its_result(runs):
    """The opening of 19b states the measured result: the best overlapped weak-scaling
    efficiency on each GPU count (and what reached it), the copy engines against NCCL
    overlapped, and torch.matmul + NCCL against the copy engines."""
    opening = _say("".join(_cells(MEASURED)[0]["source"]))
    assert opening.startswith("# 19.2 ")
    said = []
    for P in (2, 4):
        best = vd.best_rows(runs[P])
        (sc, alg, w), r = max(((k, r) for k, r in best.items() if k[0] == "weak"
                               and k[2] in ("nccl overlap", "copy", "direct")),
                              key=lambda kr: kr[1]["efficiency"])
        assert r["efficiency"] < 0.9
        said.append(f"{100 * r['efficiency']:.1f}% on {P} GPUs ({vd.NAMES[alg]}, "
                    f"{vd.WAY_NAMES[w]})")
    assert f"reached a weak-scaling efficiency of {said[0]} and {said[1]}, below the 90% " \
           "aimed for" in opening
    wins, _, torch_weak = _copy_against_the_others(runs)
    assert all(wins) and f"in all {len(wins)} 1-D and row-parallel configurations" in opening
    assert f"faster in {sum(torch_weak)} of the {len(torch_weak)} weak-scaling" in opening


def test_the_algorithms_page_states_its_result_and_points_to_the_measurements(runs):
    """19's opening states the CPU run's result and that no overlapped schedule reached 90%
    on the GPUs, and leaves the measured numbers to 19b."""
    opening = _say("".join(_cells(PAGE)[0]["source"]))
    assert "{doc}`19b-measured`" in opening
    assert "to float32 rounding of a float64 NumPy product" in opening
    assert "the overlapped all-gather gives wrong blocks" in opening
    assert "no overlapped schedule reached the weak-scaling efficiency of 90%" in opening
    assert all(r["efficiency"] < 0.9 for d in runs.values()
               for (sc, _, w), r in vd.best_rows(d).items()
               if sc == "weak" and w in ("nccl overlap", "copy", "direct"))


def test_the_split_pages_refer_to_each_other():
    """What crossed to the other page is linked, not 'above', 'below' or 'at the end'; the
    measured page has the chapter's set-up cell and reads the committed files itself."""
    first, measured = _say(_prose(PAGE)), _say(_prose(MEASURED))
    for phrase in ("timeline at the end", "measurements at the end", "next section",
                   "measured timelines above", "Measured on GPUs", "model above"):
        assert phrase not in first, phrase
    assert first.count("{doc}`19b-measured`") >= 3
    assert "{doc}`19-distributed`" in measured
    setup = [c for c in _cells(PAGE) if c["cell_type"] == "code"][0]
    setup_b = [c for c in _cells(MEASURED) if c["cell_type"] == "code"][0]
    assert setup_b["source"] == setup["source"] and "nb.setup()" in "".join(setup["source"])
    src = "\n".join("".join(c["source"]) for c in _cells(MEASURED) if c["cell_type"] == "code")
    assert "vd.distributed_files()" in src and "vd.block_files()" in src
    assert "vd.model_times(" in src and "check_value" not in src


# --------------------------------------------------------------------------
# The exercises' answers


def test_exercise_answers():
    from gemmcourse import exercises as ex
    from gemmlib import distributed as gd

    assert ex.expected("ch19.bytes_received", M=8192, N=32768, K=8192, P=4, b=2) == 100663296
    assert ex.expected("ch19.flops", M=8192, N=32768, K=8192, P=4) == 2 * 8192 * 32768 * 8192 / 4
    assert ex.expected("ch19.bytes_per_flop", M=8192, N=32768, K=8192, P=4, b=2) == \
        pytest.approx(3 * 2 / (2 * 32768))
    assert ex.expected("ch19.summa_bytes", n=16384, P=4, b=2) == 16384**2
    assert ex.expected("ch19.one_d_bytes", n=16384, P=4, b=2) == 1.5 * 16384**2
    assert ex.expected("ch19.gather_which", M=2048, N=16384, K=8192, P=8) == "A"
    assert ex.expected("ch19.gather_which", M=16384, N=2048, K=8192, P=8) == "B"
    comm, compute, needs = [1.5] * 4, [2.0] + [2.5] * 4, [None, 0, 1, 2, 3]
    assert ex.expected("ch19.wall_overlapped", comm=comm, compute=compute, needs=needs) == 12
    assert ex.expected("ch19.wall_serial", comm=comm, compute=compute) == 18
    assert ex.expected("ch19.bytes_pulled", rows=2048, K=8192, P=4, b=2) == 100663296
    assert ex.expected("ch19.peer_offset", call=3, piece=1, rows=2048, K=8192, chunks=2,
                       slot=32 << 20, b=2) == 50331648
    assert ex.expected("ch19.peer_offset", call=2, piece=0, rows=2048, K=8192, chunks=2,
                       slot=32 << 20, b=2) == 0
    from gemmcourse.exercises.ch19 import panels, split_sizes

    assert split_sizes(13, 3) == gd.split_sizes(13, 3)
    assert panels([3, 4], [2, 5]) == gd.panels([3, 4], [2, 5])


@pytest.mark.parametrize("page, want", [
    (PAGE, {"summa_bytes", "one_d_bytes", "gather_which", "bytes_pulled", "peer_offset"}),
    (MEASURED, {"bytes_received", "flops", "bytes_per_flop", "wall_overlapped", "wall_serial"}),
], ids=["19", "19b"])
def test_the_page_checks_only_through_the_exercises(page, want):
    """The chapter's exercises, on the page whose idea each one is (bytes of the algorithms and
    transports on 19, bytes into time on 19b), each page's numbered from 1."""
    src = "\n".join("".join(c["source"]) for c in _cells(page) if c["cell_type"] == "code")
    assert "check_value" not in src and "check_hidden" not in src
    assert set(re.findall(r'ex\.check\(\s*"ch19\.(\w+)"', src)) == want
    numbers = [int(n) for n in re.findall(r"(?m)^\*\*(\d+)\. ", _prose(page))]
    assert numbers == list(range(1, len(numbers) + 1)) and numbers


# --------------------------------------------------------------------------
# The live pieces: short labels, the check summary, the lifetime experiment


def test_short_labels():
    assert vd.short_label("allgather_matmul gather=A overlap=True chunks=1 transport=copy") == \
        "gather A, copy transport"
    assert vd.short_label("matmul_reduce_scatter overlap=True transport=nccl chunks=2") == \
        "reduce-scatter, nccl, overlap"


def test_check_summary_and_lifetime_table():
    rows = [("3x4x5", "all-gather A", v, r, (3, 1), 1e-7) for v in ("-", "copy")
            for r in range(2)] + [("3x4x5", "SUMMA 1x2", "pipelined", 0, (3, 2), 2e-7)]
    s = vd.check_summary(rows)
    assert s[0] == ("all-gather A", "plain, copy", 4, 1, 2, "1.0e-07")
    assert s[-1][0] == "SUMMA 1x2"
    life = [(r, g, 3, held, 0 if held else r % 2, 1e-8 if held else float("nan"))
            for r in range(2) for held in (True, False) for g in "AB"]
    t = vd.lifetime_table(life)
    assert [row[3] for row in t][:2] == ["right", "right"] and t[2][3].startswith("WRONG")
    assert t[2][2] == "0, 1"


def test_the_lifetime_experiment_on_two_processes():
    """What the page shows: with the runner's hold nothing is lost and every block is right;
    without it staging buffers are lost and blocks are wrong."""
    pytest.importorskip("torch.distributed")
    from gemmlib import distributed as gd

    out = gd.spawn_cpu(vd.lifetime_demo, 2, timeout=240)
    rows = [(r, *row) for r, life in enumerate(out) for row in life]
    held = [r for r in rows if r[3]]
    dropped = [r for r in rows if not r[3]]
    assert all(r[4] == 0 and r[5] < 1e-5 for r in held)
    assert sum(r[4] for r in dropped) > 0
    assert any(not (r[5] < 1e-5) for r in dropped)   # a peer sent NaN


# --------------------------------------------------------------------------
# Figures: legible at the book's width


@pytest.fixture
def book_style():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gemmcourse import notebook as nb

    nb._style_figures()
    yield
    plt.close("all")


def _smallest_shown(fig):
    from matplotlib.text import Text

    from gemmcourse import viz

    fig.canvas.draw()
    scale = viz.shown_scale(fig)
    return min(t.get_fontsize() * scale for t in fig.findobj(Text)
               if t.get_visible() and t.get_text().strip())


def test_measured_timeline_figure(runs, book_style):
    from gemmcourse import viz

    d = runs[4]
    best = vd.best_rows(d)
    keys = [vd.timeline_key("fp16", "weak", "gather_A", best[("weak", "gather_A", w)]["options"])
            for w in ("nccl", "nccl overlap", "copy")]
    fig = vd.plot_measured_timelines(d, keys, titles=["a", "b", "c"],
                                     reference_ms=vd.single_ms(d))
    assert fig.get_figwidth() * fig.dpi <= viz.BOOK_WIDTH_PX
    assert _smallest_shown(fig) >= viz.MIN_FONT_PT - 1e-6
    assert len(fig.axes) == 3


@pytest.mark.parametrize("make", [
    lambda: vd.plot_ratio(4096, Ps=(2, 4, 8)),
    lambda: vd.plot_model_efficiency(P=4, sizes=[1024, 8192]),
    lambda: vd.plot_winner_map(P=4),
    lambda: vd.plot_timeline([dict(rank=r, call=0, kind=k, label=l, start_ms=s, end_ms=e)
                              for r in range(2) for k, l, s, e in (
                                  ("call", "allgather_matmul gather=A overlap=False", 0, 5),
                                  ("comm", "g", 0, 2), ("compute", "p", 2, 5))], title="t"),
], ids=["ratio", "model", "winner", "cpu timeline"])
def test_paper_figures_are_legible(make, book_style):
    from gemmcourse import viz

    fig = make()
    assert fig.get_figwidth() * fig.dpi <= viz.BOOK_WIDTH_PX
    assert _smallest_shown(fig) >= viz.MIN_FONT_PT - 1e-6
