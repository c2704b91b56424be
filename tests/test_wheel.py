"""The installed package, away from the checkout: a wheel built from this tree, installed into
a fresh virtual environment outside the repository, must carry the tuning tables that
``kernel="auto"`` reads, and ``auto``'s choice made there must use them.

The wheel is built offline (``--no-build-isolation``: the running environment's setuptools)
from a copy of what the wheel is made of. The new environment gets its dependencies (numba-cuda,
NumPy, ...) through a ``.pth`` file naming the running environment's site-packages, read after
its own; the checkout is on no path, so the gemmlib imported there is the installed one.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# What the new environment runs: auto's choice on an H200 (tuning lookups are off in the
# simulator, so the device and the switch are set as test_autotune does).
_CHOOSE = """\
import dataclasses, json, sys
from pathlib import Path
import gemmlib
from gemmlib import backend, dispatch, tuning
venv = Path(sys.prefix).resolve()
assert Path(gemmlib.__file__).resolve().is_relative_to(venv), gemmlib.__file__
assert tuning.PACKAGE_TUNING_DIR.resolve().is_relative_to(venv), tuning.PACKAGE_TUNING_DIR
h200 = dataclasses.replace(backend.device_info(), name="NVIDIA H200", compute_capability=(9, 0),
                           sm_count=132)
backend.device_info = lambda device_id=None: h200
backend.SIMULATOR = False
table = json.loads((tuning.PACKAGE_TUNING_DIR / "nvidia-h200.json").read_text())
out = {}
for shape in ((4096, 4096, 4096), (1024, 1024, 8192)):
    spec = dispatch.select(*shape)
    entry = table["kernels"]["warptile"][tuning.shape_class(*shape)]
    out["x".join(map(str, shape))] = dict(name=spec.name, params=spec.params, entry=entry)
print("CHOICES", json.dumps(out))
"""


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this tree (its working copy of what the wheel holds), built offline."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for pkg in ("gemmlib", "gemmcourse"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "-w", str(dist), str(src)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = dist.glob("gemmlib-*.whl")
    return wheel


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None,
                    reason="building the wheel offline needs setuptools in this environment")
def test_wheel_ships_the_tuning_tables_and_auto_reads_them(tmp_path):
    import zipfile

    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(p.name for p in (ROOT / "gemmlib" / "data" / "tuning").glob("*.json"))
    assert shipped and all(f"gemmlib/data/tuning/{n}" in names for n in shipped), sorted(names)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    # without PYTHONPATH: a checkout on it (with its gemmlib.egg-info) reads as installed
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                          "--no-deps", "--no-index", str(wheel)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    outer = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    Path(site, "zz-dependencies.pth").write_text("\n".join(outer) + "\n")   # after its own
    for d in outer:       # the dependencies' start-up hooks (numba-cuda's), not the checkout's
        for pth in Path(d).glob("*.pth"):                            # editable gemmlib
            if not pth.name.startswith("__editable__"):
                shutil.copy(pth, Path(site, pth.name))

    env.update(NUMBA_ENABLE_CUDASIM="1", GEMMLIB_CACHE=str(tmp_path / "cache"))
    run = subprocess.run([str(py), "-c", _CHOOSE], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("CHOICES "))
    choices = json.loads(line.split(" ", 1)[1])
    square = choices["4096x4096x4096"]
    assert square["name"].startswith("warptile") and square["params"] == square["entry"]["params"]
    deep = choices["1024x1024x8192"]        # tuned with K slices: split-K with that count
    assert deep["entry"]["splits"] > 1
    assert deep["params"] == dict(deep["entry"]["params"], SPLITS=deep["entry"]["splits"])
