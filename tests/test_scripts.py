"""The GPU-side scripts' pure parts, checked without a GPU, and the rules for scripts.

``scripts/`` holds what users and CI run, ``scripts/experiments/`` the measurements worth
running again; ``results/`` holds data only (the one-off scripts that made it are in git,
named in results/MANIFEST.md). Scripts use gemmlib's public names only.
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
    cv = _load("scripts/experiments/compare_variants.py")
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


def test_sanitize_hopper_kernels_and_shapes():
    """``--kernels hopper``: every Hopper rung in each precision, with the inputs it takes;
    the ``@blocks`` / ``/slices`` shapes only re-launch the same compiled kernels."""
    st = _load("scripts/sanitize_target.py")
    hopper = st.expand("hopper")
    assert hopper == list(st.hopper()) and st.expand("hopper,naive,wgmma_ws:bf16")[-1] == "naive"
    assert not {"naive", "skinny", "mma_pipeline:fp16"} & set(hopper)
    for rung in ("wgmma_async", "wgmma_tma", "wgmma_ws", "wgmma_split_k"):
        assert {f"{rung}:fp16", f"{rung}:bf16"} <= set(hopper)
    assert {"wgmma_tf32", "wgmma_fp8:e4m3", "wgmma_fp8:e5m2"} <= set(hopper)
    specs = {n: st.kernel_spec(n) for n in hopper}
    assert specs["wgmma_ws:bf16"].dtype == "bfloat16" and specs["wgmma_ws:fp16"].dtype == "float16"
    assert specs["wgmma_tf32"].precision == "tf32" and specs["wgmma_tf32"].dtype == "float32"
    fp8 = specs["wgmma_fp8:e4m3:fp32:KN"]
    assert (fp8.precision, fp8.params["OUT"], fp8.b_operand) == ("e4m3", "fp32", "KN")
    assert (specs["wgmma_fp8:e5m2"].precision, specs["wgmma_fp8:e5m2"].b_operand) == ("e5m2", "NK")
    assert {"wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2",
            "wgmma_store:bf16:OUT=bf16:STAGES=4:PIECES=2"} <= set(hopper)   # auto's 16-bit C
    # another build of a rung: KEY=VALUE items after the precision (auto's 16-bit C on Hopper)
    o16 = specs["wgmma_store:bf16:OUT=bf16:STAGES=4:PIECES=2"]
    assert o16.name == "wgmma_store_bf16_128x256_s4_o16_p2" and o16.params["STAGES"] == 4

    assert st.parse_shape("300x520x528@4/3") == ("300x520x528", 4, 3)
    assert st.parse_shape("tile+") == ("tile+", None, None)
    assert st.parse_shape("67x45x37/2") == ("67x45x37", None, 2)
    import pytest

    with pytest.raises(ValueError):
        st.parse_shape("67x45")
    with pytest.raises(ValueError):
        st.kernel_spec("wgmma_store:fp16:STAGES")
    # persistent rungs (grid-stride tile loops) take a capped grid; one tile per block do not
    for n, s in specs.items():
        rung = n.split(":")[0]
        if rung in ("wgmma_ws", "wgmma_split_k", "wgmma_tf32", "wgmma_fp8"):
            assert st.grid_strided(s), n
        elif rung in ("wgmma_async", "wgmma_tma"):
            assert not st.grid_strided(s), n
    ws = specs["wgmma_ws:bf16"]
    capped = st.with_blocks(ws, 4)
    assert capped.kernel is ws.kernel and capped.grid(10**4, 10**4, 64)[0] <= 4
    split = st.with_splits(specs["wgmma_split_k:bf16"], 3)
    assert split.params["SPLITS"] == 3
    assert split.code_params == specs["wgmma_split_k:bf16"].code_params
    assert st.with_splits(ws, 3) is None


def test_sanitize_dry_run_in_simulator(tmp_path):
    """scripts/sanitize.py end to end in the simulator, with a stand-in for compute-sanitizer
    (runs the target, prints a clean summary): bf16 and FP8 rungs, the warm-up, the JSON."""
    import json
    import os

    fake = tmp_path / "fake-sanitizer"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import subprocess, sys\n"
        "a = sys.argv[1:]\n"
        "if a[:1] in (['--help'], ['--version']):\n"
        "    print('  --padding arg\\n  --num-cuda-barriers arg\\nVersion 0.0.1')\n"
        "    sys.exit(0)\n"
        "i = next(i for i, x in enumerate(a) if x.endswith('sanitize_target.py'))\n"
        "rc = subprocess.run(a[i - 1:]).returncode\n"
        "print('========= ERROR SUMMARY: 0 errors', flush=True)\n"
        "sys.exit(rc)\n")
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = dict(os.environ, SANITIZE_SIM="1", NUMBA_ENABLE_CUDASIM="1")
    cp = subprocess.run([sys.executable, str(ROOT / "scripts" / "sanitize.py"), "--sanitizer",
                         str(fake), "--kernels", "wgmma_ws:bf16,wgmma_fp8:e5m2", "--tools",
                         "memcheck,racecheck", "--shapes", "67x45x37", "--warm", "--jobs", "3",
                         "--out", str(out), "--deadline", "600"],
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    summary = json.loads((out / "sanitize.json").read_text())
    assert summary["clean"] and summary["sanitizer_version"] == "0.0.1"
    assert summary["options"]["memcheck"][:2] == ["--padding", "65536"]
    assert "--num-cuda-barriers" in summary["options"]["racecheck"]
    runs = summary["warm"] + summary["runs"]
    assert len(runs) == 6 and all(r["results"] for r in runs)
    assert all(" ok " in x for r in runs for x in r["results"])


def test_batched_gpu_smoke_in_simulator(tmp_path):
    """scripts/batched_gpu.py --smoke: its candidates build, launch batched and match float64
    (the GPU run times them); and its candidate list follows the products' width."""
    import json
    import os

    out = tmp_path / "smoke.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    cp = subprocess.run([sys.executable, str(ROOT / "scripts" / "batched_gpu.py"), str(out),
                         "--smoke", "--precisions", "bf16", "--layouts", "NK",
                         "--only", "st_s4p2,pp,auto"],
                        capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["candidate"] for r in rows] == ["st_s4p2", "pp", "auto"]
    assert all(r["ok"] and r["layout"] == "NK" and r["us"] is None for r in rows)
    bg = _load("scripts/batched_gpu.py")
    narrow = bg.candidates("fp16", 128, "KN")
    assert "st_s4p2" not in narrow and narrow["ws"].tile == (128, 128)
    assert bg.candidates("fp16", 1024, "NK")["st_s4p2"].b_operand == "NK"


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


def _manifest_paths():
    """Script paths results/MANIFEST.md names: taken out of the tree, kept in git."""
    import re

    text = (ROOT / "results" / "MANIFEST.md").read_text(encoding="utf-8")
    out = set()
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        folder = re.match(r"`([\w./-]+)/`", section).group(1)
        out |= {f"{folder}/{name}" for name in re.findall(r"^\| `([\w.-]+\.(?:py|sh))` \|",
                                                           section, re.M)}
    return out


def test_script_paths_in_docs_exist():
    """Every scripts/... or results/... .py/.sh named in the docs, code or chapters exists,
    or is one results/MANIFEST.md names (removed from the tree, kept in git)."""
    import re

    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "results").rglob("*.md")),
             *_script_files(), *sorted((ROOT / "gemmlib").rglob("*.py")),
             *sorted((ROOT / "chapters").glob("*.ipynb"))]
    kept_in_git = _manifest_paths()
    assert len(kept_in_git) >= 50 and "results/loopgap-2026-11-25/loopgap_gpu.py" in kept_in_git
    missing = set()
    for f in files:
        if not f.exists():
            continue
        for m in re.finditer(r"\b(?:scripts|results)/[\w./-]+\.(?:py|sh)\b",
                             f.read_text(encoding="utf-8")):
            if not (ROOT / m.group(0)).is_file() and m.group(0) not in kept_in_git:
                missing.add(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert not missing, "\n".join(sorted(missing))


def test_manifest_commits_hold_the_scripts():
    """Each removed script is in git at the commit results/MANIFEST.md names."""
    import re

    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        import pytest

        pytest.skip("not a git checkout")
    text = (ROOT / "results" / "MANIFEST.md").read_text(encoding="utf-8")
    checked = 0
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        folder = re.match(r"`([\w./-]+)/`", section).group(1)
        for name, commit in re.findall(r"^\| `([\w.-]+\.(?:py|sh))` \| ([0-9a-f]{7,40}) \|",
                                       section, re.M):
            if subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT,
                              capture_output=True).returncode:
                import pytest

                pytest.skip(f"commit {commit} is not in this clone (shallow?)")
            run = subprocess.run(["git", "cat-file", "-e", f"{commit}:{folder}/{name}"], cwd=ROOT,
                                 capture_output=True)
            assert run.returncode == 0, f"{folder}/{name} not at {commit}: {run.stderr.decode()}"
            checked += 1
    assert checked >= 50


# Owned by the distributed work (gemmlib.distributed): it times the private all-gather helper.
_PRIVATE_NAME_EXCEPTIONS: set = set()


def _private_gemmlib_names(path: Path) -> list[str]:
    """``from gemmlib.x import _y``, ``import gemmlib._x``, and ``mod._y`` where ``mod`` is a
    gemmlib module or object imported by the file; dunder names are public."""
    import ast

    def private(name):
        return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))

    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "gemmlib":
                    if any(map(private, a.name.split("."))):
                        found.append(f"{node.lineno}: import {a.name}")
                    bound.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "gemmlib":
            if any(map(private, node.module.split("."))):
                found.append(f"{node.lineno}: from {node.module}")
            for a in node.names:
                if private(a.name):
                    found.append(f"{node.lineno}: from {node.module} import {a.name}")
                bound.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_scripts_use_public_names_and_results_holds_data():
    import re

    assert not sorted(str(p.relative_to(ROOT)) for ext in ("py", "sh")
                      for p in (ROOT / "results").rglob(f"*.{ext}")), \
        "results/ holds data: move a script to scripts/experiments/ or name it in MANIFEST.md"
    bad = {}
    for path in _script_files():
        rel = str(path.relative_to(ROOT))
        if rel in _PRIVATE_NAME_EXCEPTIONS:
            continue
        if path.suffix == ".py":
            hits = _private_gemmlib_names(path)
        else:      # shell scripts: the Python they embed
            hits = [m.group(0) for m in re.finditer(
                r"from gemmlib[\w.]* import [^\n]*\b_[a-z]\w*|\bgemmlib(?:\.\w+)*\._[a-z]\w*",
                path.read_text(encoding="utf-8"))]
        if hits:
            bad[rel] = hits
    assert not bad, bad


def test_the_private_name_check_finds_them(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("from gemmlib import api, bench_models as BM\nfrom gemmlib.bench import _Timer\n"
                 "import gemmlib._lowering\napi._describe(1)\nBM.operand_sets(1, 2)\n"
                 "gemmlib.__version__\n")
    hits = _private_gemmlib_names(f)
    assert [h.split(": ", 1)[1] for h in hits] == [
        "from gemmlib.bench import _Timer", "import gemmlib._lowering", "api._describe"], hits


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


def test_build_params_reads_key_value_items():
    from gemmlib.kernels import build_params

    import pytest

    assert build_params(["OUT=bf16", "STAGES=4", "REGS=40/232"]) == dict(
        OUT="bf16", STAGES=4, REGS=(40, 232))
    for bad in ("STAGES", "=4"):
        with pytest.raises(ValueError):
            build_params([bad])


def test_spec_tolerance_adds_a_16_bit_c_rounding():
    from gemmlib.kernels import wgmma_store
    from gemmlib.precision import OUT16_ROUNDOFF
    from gemmlib.verify import spec_tolerance

    f32, o16 = wgmma_store.build("bf16"), wgmma_store.build("bf16", OUT="bf16")
    assert spec_tolerance(o16, 64) == spec_tolerance(f32, 64) + OUT16_ROUNDOFF["bf16"]


def test_tune_cv_replays_a_tune_file_one_model_out(tmp_path, capsys):
    """scripts/tune_cv.py on rows where one candidate leads the rule on every layer: the
    table learnt without each model picks it for that model's layers, as the oracle does."""
    import json

    from gemmlib import tune_hopper

    rows = []
    for use, N, K in tune_hopper.layer_shapes():
        for M in (128, 512):
            base = dict(use=use, M=M, N=N, K=K, precision="bf16", torch_us=10.0)
            rows += [dict(base, candidate="rule", us=20.0, pct_torch=50.0),
                     dict(base, candidate="swap64x128", us=12.5, pct_torch=80.0)]
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(dict(meta=dict(precision="bf16"), rows=rows)))
    _load("scripts/tune_cv.py").main(str(path))
    out = capsys.readouterr().out
    assert "rule     50.0" in out and "class    80.0" in out and "oracle   80.0" in out
