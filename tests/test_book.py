"""The book's structure: every page in the TOC exists, notebooks are set up the same way,
and the notebook helpers behave (the repository URL: tests/test_colab_setup.py)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


# The repository URL, and every chapter's set-up cell that installs from it, are checked in
# tests/test_colab_setup.py (against _config.yml, and by running the cell's install path).


def test_book_is_jupyter_book_1_and_never_executes():
    config = (ROOT / "_config.yml").read_text()
    assert re.search(r"execute_notebooks:\s*[\"']?off", config)
    assert (ROOT / "_toc.yml").is_file() and not (ROOT / "myst.yml").exists()


def test_toc_files_exist():
    toc = (ROOT / "_toc.yml").read_text()
    files = re.findall(r"(?:file|root):\s*(\S+)", toc)
    assert files
    for f in files:
        assert any((ROOT / f).with_suffix(s).is_file() for s in (".md", ".ipynb")), f


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_setup_cell(nb):
    cells = json.loads(nb.read_text())["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# ")
    setup = "".join(cells[1]["source"])
    assert "google.colab" in setup and "NUMBA_ENABLE_CUDASIM" in setup
    assert "nb.setup()" in setup
    src = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    # CuPy only through gemmlib.backend (never imported directly in a notebook)
    assert "import cupy" not in src


def test_exercise_checks_never_raise(capsys):
    import gemmlib
    from gemmcourse import notebook as nb

    spec = gemmlib.get_kernel("coalesced")

    def unwritten(*args):
        raise NotImplementedError

    def wrong(bx, by, tx, ty):
        return bx * 32 + tx, by * 32 + ty

    assert nb.check_index_function(unwritten, spec) is False
    assert nb.check_index_function(wrong, spec) is False
    assert nb.check_index_function(spec.index["c_element"], spec) is True
    assert nb.check_value(..., 3, "x") is False and nb.check_value(3.0, 3, "x") is True
    assert nb.check_matmul(lambda A, B: A @ B) is True
    assert nb.check_matmul(lambda A, B: (A @ B).T) is False
    out = capsys.readouterr().out
    assert "[correct]" in out and "[not yet]" in out


def test_notebook_helpers_in_simulator():
    from gemmlib import backend
    from gemmcourse import notebook as nb

    if not backend.SIMULATOR:
        pytest.skip("simulator-only expectations")
    assert max(max(s) for s in nb.verify_shapes()) <= 70
    assert nb.live_shapes() == [] and nb.memory_bandwidth_gbs() is None
    assert "SIMULATOR" in nb.environment_summary()
    assert "def c_element" in nb._source_of("naive")
    assert "syncthreads" in nb._source_of(__import__("gemmlib").get_kernel("shared"))
    table = nb.hardware_table(__import__("gemmlib").get_kernel("shared"))
    assert "<table" in table._repr_html_()


def test_every_rung_has_a_chapter_in_the_toc():
    """Every chapter notebook is in the TOC; a rung without a chapter yet only warns
    (a new rung may land before its chapter is written)."""
    import warnings

    import gemmlib

    toc = (ROOT / "_toc.yml").read_text()
    for nb in NOTEBOOKS:
        assert f"chapters/{nb.stem}" in toc, f"{nb.name} is not in _toc.yml"
    for spec in gemmlib.all_specs():
        if f"chapters/{spec.chapter}" not in toc:
            warnings.warn(f"rung {spec.name!r} (chapter {spec.chapter}) has no chapter in "
                          "the book yet")


def test_every_rung_names_the_page_that_builds_it():
    """A rung's ``chapter`` is the page that builds it, not its chapter's first page: among the
    pages of its chapter (13, 13b, ...) that page names the rung's module at least as often as
    any other, and at least once."""
    import gemmlib

    text = {nb.stem: "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
            for nb in NOTEBOOKS}
    for spec in gemmlib.all_specs():
        if spec.chapter not in text:
            continue                 # no page yet: the test above warns
        base = spec.module.rsplit(".", 1)[-1]
        counts = {page: len(re.findall(rf"\b{base}\b", t)) for page, t in text.items()
                  if page[:2] == spec.chapter[:2]}
        assert counts[spec.chapter] > 0, f"{spec.chapter} never names rung {spec.name!r}"
        most = max(counts, key=counts.get)
        assert counts[spec.chapter] == counts[most], (
            f"rung {spec.name!r} says chapter {spec.chapter}, but {most} names {base} more "
            f"often ({counts}): is {most} the page that builds it?")
