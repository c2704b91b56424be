"""The GPU-side scripts' pure parts, checked without a GPU.

``scripts/`` holds what users and CI run; the one-off experiments live beside
their data under ``results/`` (see results/README.md).
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(relpath):
    path = ROOT / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_variants_parses_shapes_and_variants():
    cv = _load("results/uidx-2026-11-22/compare_variants.py")
    assert cv.parse_shape("64") == (64, 64, 64)
    assert cv.parse_shape("4095x3073x2047") == (4095, 3073, 2047)
    label, spec, expr = cv.parse_variant("wide=warptile:BM=128,BN=256,BK=16")
    assert label == "wide" and expr == "warptile:BM=128,BN=256,BK=16"
    assert spec.params["BM"] == 128 and spec.params["BN"] == 256 and spec.params["BK"] == 16
    label, spec, _ = cv.parse_variant("hand=layout_nt:indexing='hand'")
    assert spec.name.endswith("_hand")


def test_sanitize_report_parser_selftest():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "sanitize.py"), "--selftest"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def _script_files():
    return sorted(p for d in ("scripts", "results") for ext in ("py", "sh")
                  for p in (ROOT / d).rglob(f"*.{ext}"))


def test_scripts_find_the_repository_root():
    """Scripts run from wherever they live: each one's way to the root must land on it."""
    import re

    found = 0
    for path in _script_files():
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"Path\(__file__\)\.resolve\(\)\.(parents\[(\d)\]|parent\.parent)", text):
            up = int(m.group(2)) + 1 if m.group(2) else 2
            assert path.parents[up - 1] == ROOT, f"{path.relative_to(ROOT)}: {m.group(0)}"
            found += 1
        for m in re.finditer(r'cd "\$\(dirname "\$0"\)/([./]+)"', text):
            assert (path.parent / m.group(1)).resolve() == ROOT, \
                f"{path.relative_to(ROOT)}: {m.group(0)}"
            found += 1
    assert found >= 10, found


def test_script_paths_in_docs_exist():
    """Every scripts/... or results/... .py/.sh named in the docs, code or chapters exists."""
    import re

    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "results").rglob("README.md")),
             *_script_files(), *sorted((ROOT / "gemmlib").rglob("*.py")),
             *sorted((ROOT / "chapters").glob("*.ipynb"))]
    missing = set()
    for f in files:
        if not f.exists():
            continue
        for m in re.finditer(r"\b(?:scripts|results)/[\w./-]+\.(?:py|sh)\b",
                             f.read_text(encoding="utf-8")):
            if not (ROOT / m.group(0)).is_file():
                missing.add(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, "\n".join(sorted(missing))


def test_ncu_models_summary_groups_each_case():
    """The committed H100 profile splits into one kernel group per case, gemmlib first."""
    import contextlib
    import io

    nm = _load("scripts/ncu_models.py")
    d = ROOT / "results" / "ncu-models-2026-11-25"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        nm.summarize(d / "h100-ncu-models.csv", d / "h100-ncu-cases.json")
    text = buf.getvalue()
    assert "note:" not in text, text[-300:]   # as many groups as cases
    rows = [ln for ln in text.splitlines() if ln.startswith("| fp16") or ln.startswith("| bf16")
            or ln.startswith("| 3xtf32")]
    assert len(rows) >= 2 * len(nm.CASES)
    assert all(r.split(" | ")[1] in ("gemmlib", "cuBLAS") for r in rows)


def test_models_table_reads_the_committed_suite():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "models_table.py"),
                          str(ROOT / "results" / "models-nvidia-h200-2026-11-25.json"), "--before",
                          str(ROOT / "results" / "models-nvidia-h200-2026-11-24.json")],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "## fp16: 52 shapes, geometric mean" in out.stdout
