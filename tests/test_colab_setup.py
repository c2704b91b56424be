"""The Colab set-up: every chapter's first cell installs the course from the repository set in
``_config.yml``, and that install path works.

The repository's URL and branch are set once, in ``_config.yml``; ``scripts/set_repository.py``
writes them into each chapter's set-up cell (``gemmcourse.colab.setup_cell``) and into
``gemmcourse/colab.py``'s fallback. The tests below check that everything agrees, that the
script rewrites what it must when the repository moves, and then run the cell's install path
the way a fresh Colab runtime does, without a GPU and without the network.
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

from gemmcourse import colab

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


def _first_code_cell(nb: Path) -> dict:
    return next(c for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]
                if c["cell_type"] == "code")


def test_config_reader_agrees_with_yaml():
    yaml = pytest.importorskip("yaml")
    repo = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    assert colab.read_repository() == (repo["url"].rstrip("/"), repo.get("branch", "main"))


def test_repository_is_set_once_in_config():
    """Every chapter's set-up cell is the one generated from _config.yml, word for word."""
    from gemmcourse import notebook

    url, branch = colab.read_repository()
    assert (notebook.REPOSITORY, notebook.BRANCH) == (url, branch)
    assert colab._WRITTEN == (url, branch), "run: python scripts/set_repository.py"
    cell = colab.setup_cell(url, branch)
    assert f" --branch {branch} {url} " in cell
    assert len(NOTEBOOKS) >= 10
    for nb in NOTEBOOKS:
        first = _first_code_cell(nb)
        assert "".join(first["source"]) == cell, \
            f"{nb.name}: set-up cell differs from _config.yml's; run: python scripts/set_repository.py"
        assert "hide-input" in first["metadata"].get("tags", []), nb.name


def test_set_repository_check_passes():
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "set_repository.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_set_repository_rewrites_everything_when_the_repository_moves(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "gemmcourse").mkdir()
    for nb in NOTEBOOKS[:2]:
        shutil.copy(nb, tmp_path / "chapters" / nb.name)
    shutil.copy(ROOT / "gemmcourse" / "colab.py", tmp_path / "gemmcourse" / "colab.py")
    url, branch = colab.read_repository()
    config = (ROOT / "_config.yml").read_text()
    moved = config.replace(f"url: {url}", "url: https://example.org/someone/gemm-fork") \
                  .replace(f"branch: {branch}", "branch: course/v2")
    assert moved.count("someone/gemm-fork") == 1 and moved.count("course/v2") == 1
    (tmp_path / "_config.yml").write_text(moved)
    script = [sys.executable, str(ROOT / "scripts" / "set_repository.py"), "--root", str(tmp_path)]

    assert subprocess.run(script + ["--check"], capture_output=True).returncode == 1
    run = subprocess.run(script, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert subprocess.run(script + ["--check"], capture_output=True).returncode == 0

    new_cell = colab.setup_cell("https://example.org/someone/gemm-fork", "course/v2")
    for nb in NOTEBOOKS[:2]:
        raw = (tmp_path / "chapters" / nb.name).read_text(encoding="utf-8")
        data = json.loads(raw)
        assert raw == json.dumps(data, indent=1, ensure_ascii=False) + "\n"   # Jupyter's layout
        before = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        i = next(k for k, c in enumerate(before) if c["cell_type"] == "code")
        first, was = data["cells"][i], before[i]
        assert "".join(first["source"]) == new_cell
        assert first["outputs"] == was["outputs"] and first.get("id") == was.get("id")
        assert data["cells"][:i] + data["cells"][i + 1:] == before[:i] + before[i + 1:]
    written = (tmp_path / "gemmcourse" / "colab.py").read_text()
    assert '_WRITTEN = ("https://example.org/someone/gemm-fork", "course/v2")' in written


def test_pyproject_ships_what_the_cell_installs():
    """The cell installs the project with extras cu12,gpu-cu12: both exist, and the package
    discovery takes gemmlib and gemmcourse (the notebooks import both)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for extra in colab.EXTRAS.split(","):
        assert extra in extras, extra
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert {"gemmlib*", "gemmcourse*"} <= set(include)


# --------------------------------------------------------------------------
# The install path, run


def _snapshot(dst: Path, branch: str) -> Path:
    """A git repository whose one commit, on ``branch``, is this checkout's working tree
    (tracked and untracked-but-not-ignored files, uncommitted edits included): what the next
    commit would publish. Made with a fresh ``git init`` in ``dst``; the checkout's own
    repository is only read."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for name in filter(None, listed.stdout.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
           "-c", "commit.gpgsign=false", "-C", str(dst)]
    for cmd in (["init", "-q", "-b", branch], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run(git + cmd, check=True, capture_output=True)
    return dst


_SESSION = """\
import sys, types
sys.modules["google"] = types.ModuleType("google")          # what Colab's runtime has
sys.modules["google.colab"] = types.ModuleType("google.colab")
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
cell = open(sys.argv[1], encoding="utf-8").read()
result = shell.run_cell(cell)
err = result.error_in_exec
print("CELL:", "ok" if err is None else f"{type(err).__name__}: {err}", flush=True)
if len(sys.argv) > 2:
    check = shell.run_cell(open(sys.argv[2], encoding="utf-8").read())
    if check.error_in_exec is not None:
        sys.exit(f"CHECK FAILED: {check.error_in_exec!r}")
"""

_AFTER_RESTART = """\
import numpy as np, gemmlib, gemmcourse
from pathlib import Path
clone = Path(CLONE).resolve()
for mod in (gemmlib, gemmcourse):
    assert Path(mod.__file__).resolve().is_relative_to(clone), mod.__file__
assert gemmlib.backend.SIMULATOR and dev.simulated
rng = np.random.default_rng(0)
A = rng.random((5, 7), dtype=np.float32)
B = rng.random((7, 3), dtype=np.float32)
C = gemmlib.matmul(A, B, kernel="naive")
assert np.allclose(C, A @ B, rtol=1e-5, atol=1e-5)
assert nb.repo_root() == clone, nb.repo_root()
assert nb.committed_json("bench-*.json")
assert sorted(gemmlib.tuning.PACKAGE_TUNING_DIR.glob("*.json"))
print("AFTER RESTART: ok", gemmlib.__file__)
"""


def test_colab_cell_installs_the_course(tmp_path):
    """Runs the set-up cell as a fresh Colab runtime would, twice: before the restart it must
    clone and install the course and ask for a restart; after it, skip the install, set up the
    simulator, and give a working gemmlib whose committed results are readable.

    What is real: the cell's own text, run by IPython (its ``!git clone`` and ``%pip
    install``), in a new virtual environment, from a git repository holding this checkout's
    working tree on ``_config.yml``'s branch. What is substituted: the repository URL (a
    ``file://`` URL of that snapshot), the clone's folder (under tmp_path, not /content), and
    two pip flags. The cell's requirements (numba-cuda[cu12], CuPy for CUDA 12) are hundreds
    of megabytes that a test run cannot download each time, and CI has no network to count
    on, so pip installs the course itself with ``--no-deps`` and ``--no-build-isolation``;
    the new environment sees the running environment's packages through a ``.pth`` file
    (its ``numba-cuda`` with the start-up hook that makes it ``numba.cuda``, IPython,
    setuptools; not its own editable gemmlib). That keeps the run to seconds and tests what
    can break here: the clone, the requirement syntax and extras, the package discovery, the
    editable install, and the data beside it; that the extras resolve on PyPI is left to the
    lead's Colab run (``test_pyproject_ships_what_the_cell_installs`` checks they exist).
    """
    if shutil.which("git") is None:
        pytest.skip("git not found")
    pytest.importorskip("IPython")
    if importlib.util.find_spec("setuptools") is None:       # a dependency of the book extra
        pytest.skip("needs setuptools here to build the course offline (--no-build-isolation)")
    url, branch = colab.read_repository()
    repo = _snapshot(tmp_path / "origin", branch)
    content = tmp_path / "content"                       # Colab's working folder
    content.mkdir()
    clone = content / "gemm-course"

    cell = colab.setup_cell(url, branch)
    for old, new in ((url, repo.as_uri()), (colab.CLONE_DIR, str(clone)),
                     ("%pip install -q ", "%pip install -q --no-deps --no-build-isolation ")):
        assert old in cell, old
        cell = cell.replace(old, new)
    (tmp_path / "cell.py").write_text(cell)
    (tmp_path / "session.py").write_text(_SESSION)
    (tmp_path / "after.py").write_text(f"CLONE = {str(clone)!r}\n" + _AFTER_RESTART)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    outer = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    Path(site, "00-outer-env.pth").write_text("\n".join(outer) + "\n")    # read first
    for d in outer:            # the outer packages' start-up hooks (numba-cuda's redirector),
        for pth in Path(d).glob("*.pth"):          # not the outer checkout's editable gemmlib
            if not pth.name.startswith("__editable__"):
                shutil.copy(pth, Path(site, pth.name))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(NUMBA_ENABLE_CUDASIM="1", IPYTHONDIR=str(tmp_path / "ipython"), MPLBACKEND="Agg",
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PATH=f"{venv / 'bin'}:{env['PATH']}")

    def session(*files):
        run = subprocess.run([str(py), str(tmp_path / "session.py"), *map(str, files)],
                             cwd=content, env=env, capture_output=True, text=True, timeout=600)
        return run, run.stdout + run.stderr

    # Before the restart: not installed, so the cell clones, installs and stops.
    assert subprocess.run([str(py), "-c", "import gemmlib"], cwd=content, env=env,
                          capture_output=True).returncode != 0, "gemmlib visible before install"
    run, out = session(tmp_path / "cell.py")
    assert "CELL: SystemExit: Installed. Restart the runtime" in out, out
    assert (clone / "gemmlib").is_dir() and (clone / "results").is_dir(), out

    # After the restart: installed, so the cell goes on to the simulator and nb.setup().
    run, out = session(tmp_path / "cell.py", tmp_path / "after.py")
    assert run.returncode == 0 and "CELL: ok" in out and "AFTER RESTART: ok" in out, out
    assert "SIMULATOR" in out, out


def test_without_a_checkout_the_chapters_say_where_the_results_are(tmp_path, monkeypatch, capsys):
    """A pip install without the repository (``pip install git+URL``) has no results/ beside
    it: the helpers that read committed files return nothing, and say once why."""
    from gemmcourse import notebook as nb

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(nb, "__file__", str(tmp_path / "site-packages" / "gemmcourse" / "notebook.py"))
    monkeypatch.setattr(nb, "_NO_CHECKOUT_SAID", False)
    assert nb.repo_root() is None
    assert nb.committed_json("tuning/*.json") == [] and nb.load_results() == []
    out = capsys.readouterr().out
    assert out.count("installed without the course's checkout") == 1 and nb.REPOSITORY in out
