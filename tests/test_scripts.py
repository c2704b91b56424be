"""The GPU-side scripts' pure parts, checked without a GPU."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_compare_variants_parses_shapes_and_variants():
    cv = _load("compare_variants")
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
