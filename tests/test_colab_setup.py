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
    assert f'"--branch", "{branch}",' in cell and f'"{url}", "{colab.CLONE_DIR}"' in cell
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


def test_cu12_extra_keeps_the_cuda_libraries_torch_brings():
    """The cu12 extra must not replace the CUDA 12 libraries an installed torch was built
    with: no numba-cuda[cu12] / cuda-toolkit (which pin the newest 12.x), and each CUDA
    library it names accepts the versions torch's CUDA 12 builds pin (12.4, 12.6, 12.8)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = {r.name: r for r in map(Requirement, project["project"]["optional-dependencies"]["cu12"])}
    assert "cuda-toolkit" not in reqs and not reqs["numba-cuda"].extras, reqs
    torch_builds = {"nvidia-cuda-runtime-cu12": ("12.4.127", "12.6.77", "12.8.90"),
                    "nvidia-cuda-nvrtc-cu12": ("12.4.127", "12.6.77", "12.8.93"),
                    "nvidia-nvjitlink-cu12": ("12.4.127", "12.6.85", "12.8.93")}
    for name, versions in torch_builds.items():
        assert name in reqs, name
        assert all(reqs[name].specifier.contains(v) for v in versions), (name, reqs[name])
    assert colab.NVVM_WHEEL in reqs          # NVVM: not a torch dependency, added


def test_constraints_pin_the_installed_cuda_libraries(monkeypatch):
    """Installed nvidia-* wheels and torch are pinned as they are; NVVM follows nvJitLink."""
    from types import SimpleNamespace

    def dist(name, version):
        return SimpleNamespace(metadata={"Name": name}, version=version)

    installed = [dist("torch", "2.8.0+cu126"), dist("nvidia-cuda-runtime-cu12", "12.6.77"),
                 dist("nvidia_nvjitlink_cu12", "12.6.85"), dist("nvidia-cuda-nvcc-cu12", "12.9.86"),
                 dist("numpy", "2.0.2")]
    monkeypatch.setattr(colab.metadata, "distributions", lambda: installed)
    assert colab.constraints() == ["nvidia-cuda-runtime-cu12==12.6.77",
                                   "nvidia-nvjitlink-cu12==12.6.85", "torch==2.8.0+cu126",
                                   "nvidia-cuda-nvcc-cu12==12.6.*"]


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
    clone, pin, install and check the course and ask for a restart; after it, skip the
    install, set up the simulator, and give a working gemmlib whose committed results are
    readable.

    What is real: the cell's own text, run by IPython (each step a subprocess whose exit
    status it checks), in a new virtual environment, from a git repository holding this
    checkout's working tree on ``_config.yml``'s branch; the check step compiles a kernel
    with the real compiler and assembles it to sm_75 machine code. What is substituted: the
    repository URL (a ``file://`` URL of that snapshot), the clone's folder (under tmp_path,
    not /content), and two pip flags. The cell's requirements (numba-cuda and the CUDA 12
    wheels, CuPy for CUDA 12) are hundreds of megabytes that a test run cannot download each
    time, and CI has no network to count on, so pip installs the course itself with
    ``--no-deps`` and ``--no-build-isolation``; the new environment sees the running
    environment's packages through a ``.pth`` file (its ``numba-cuda`` with the start-up hook
    that makes it ``numba.cuda``, IPython, setuptools; not its own editable gemmlib). That
    keeps the run to seconds and tests what can break here: the clone, the pins, the
    requirement syntax and extras, the package discovery, the editable install, the compiler
    chain, and the data beside it; that the extras resolve on PyPI next to Colab's torch is
    for a run on Colab (README, "On Colab").
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

    cell = _cell(url, repo.as_uri(), branch, clone, offline_install=True)
    (tmp_path / "cell.py").write_text(cell)
    (tmp_path / "session.py").write_text(_SESSION)
    (tmp_path / "after.py").write_text(f"CLONE = {str(clone)!r}\n" + _AFTER_RESTART)
    py, env = _colab_like_venv(tmp_path)

    def session(*files):
        run = subprocess.run([str(py), str(tmp_path / "session.py"), *map(str, files)],
                             cwd=content, env=env, capture_output=True, text=True, timeout=600)
        return run, run.stdout + run.stderr

    # Before the restart: not installed, so the cell clones, installs, checks and stops.
    assert subprocess.run([str(py), "-c", "import gemmlib"], cwd=content, env=env,
                          capture_output=True).returncode != 0, "gemmlib visible before install"
    run, out = session(tmp_path / "cell.py")
    assert "CELL: SystemExit: Installed. Restart the runtime" in out, out
    assert "sm_75 machine code" in out, out        # the check compiled and assembled a kernel
    assert (clone / "gemmlib").is_dir() and (clone / "results").is_dir(), out

    # After the restart: installed, so the cell goes on to the simulator and nb.setup().
    run, out = session(tmp_path / "cell.py", tmp_path / "after.py")
    assert run.returncode == 0 and "CELL: ok" in out and "AFTER RESTART: ok" in out, out
    assert "SIMULATOR" in out, out


def _cell(url, new_url, branch, clone, offline_install):
    """The set-up cell with the repository and clone folder replaced; ``offline_install``:
    pip installs the course alone (--no-deps), built with this environment's setuptools."""
    cell = colab.setup_cell(url, branch)
    subs = [(url, new_url), (colab.CLONE_DIR, str(clone))]
    if offline_install:
        subs.append(('"install", "-q",', '"install", "-q", "--no-deps", "--no-build-isolation",'))
    for old, new in subs:
        assert old in cell, old
        cell = cell.replace(old, new)
    return cell


def _colab_like_venv(tmp_path):
    """A new virtual environment that sees this one's packages (numba-cuda with its start-up
    hook, IPython, setuptools) but not the checkout's editable gemmlib; pip offline."""
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
    # The CUDA wheels' libraries (NVRTC, NVVM, nvJitLink) are found through the site-packages
    # of the running environment, which the new one does not count as its own: name them.
    libs = sorted({str(so.parent) for d in outer for so in Path(d, "nvidia").rglob("lib*.so*")})
    env["LD_LIBRARY_PATH"] = ":".join(libs + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    return py, env


@pytest.mark.parametrize("failing", ["clone", "install"])
def test_colab_cell_stops_with_the_error_of_a_failed_step(tmp_path, failing):
    """A step that fails stops the cell with that step's output, and the cell never says
    "Installed": a repository that is not there (the clone), or requirements pip cannot get
    (the install, offline here, with the course's dependencies asked for)."""
    if shutil.which("git") is None:
        pytest.skip("git not found")
    pytest.importorskip("IPython")
    url, branch = colab.read_repository()
    content = tmp_path / "content"
    content.mkdir()
    if failing == "clone":
        origin = (tmp_path / "no-such-repository").as_uri()
    else:
        origin = _snapshot(tmp_path / "origin", branch).as_uri()
    cell = _cell(url, origin, branch, content / "gemm-course", offline_install=False)
    (tmp_path / "cell.py").write_text(cell)
    (tmp_path / "session.py").write_text(_SESSION)
    py, env = _colab_like_venv(tmp_path)
    run = subprocess.run([str(py), str(tmp_path / "session.py"), str(tmp_path / "cell.py")],
                         cwd=content, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    expected = {"clone": "CELL: RuntimeError: git clone failed (exit 128)",
                "install": "CELL: RuntimeError: pip install failed (exit 1)"}[failing]
    assert expected in out and "CELL: SystemExit" not in out, out
    if failing == "clone":
        assert "no-such-repository" in out, out     # git's own message comes with it


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
