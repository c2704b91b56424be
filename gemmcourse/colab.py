"""The chapters' set-up cell, and the repository it installs the course from.

The repository is set once, in ``_config.yml`` (``repository.url`` and ``repository.branch``;
the book's GitHub, issues, Colab and Binder buttons read it too). A Colab notebook runs
before anything of the course is installed, so its first cell must hold the URL literally:
``scripts/set_repository.py`` writes :func:`setup_cell` of that URL and branch into every
chapter, and :data:`REPOSITORY` / :data:`BRANCH` below for a pip install without
``_config.yml``; ``tests/test_colab_setup.py`` checks that all of them agree, and installs
through the cell the way Colab does.

On Colab the cell clones the repository into ``/content/gemm-course`` and installs it from
there in editable mode (``pip install -e``), rather than ``pip install git+URL``: the chapters
read what is committed beside the code (``results/``, ``figures/``),
and a pip install from git leaves those behind, while an editable install keeps gemmlib and
gemmcourse in the clone, next to them (``notebook.repo_root()`` finds it from ``__file__``).

Each step of the cell is checked, and the first that fails stops the notebook with its
output: the clone, the pins (:func:`constraints`: the CUDA libraries Colab's torch was built
with stay as they are), the install, and a check of the result in a fresh process
(:func:`check`: the packages import, and a kernel compiles to machine code).

This module imports nothing heavy, so the script can use it without numba; the cell runs it
as a file (``python gemmcourse/colab.py constraints FILE``) before anything is installed.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

#: Where the Colab cell clones the repository (Colab's working folder is /content).
CLONE_DIR = "/content/gemm-course"
#: What the Colab cell installs: Colab's GPUs run a CUDA 12 driver.
EXTRAS = "cu12,gpu-cu12"
#: NVVM (numba's compiler from Python to PTX) ships in this wheel for CUDA 12.
NVVM_WHEEL = "nvidia-cuda-nvcc-cu12"

# Written by scripts/set_repository.py from _config.yml: the values a pip install (no
# _config.yml beside the package) falls back to.
_WRITTEN = ("https://github.com/gemm-course/gemm-course", "main")

_ROOT = Path(__file__).resolve().parent.parent
_URL_OK = re.compile(r"^(https://|http://|file://|ssh://|git@)[^\s\"'{}$\\]+$")
_BRANCH_OK = re.compile(r"^(?!-)(?!.*\.\.)[A-Za-z0-9._/-]+(?<![/.])$")


def read_repository(config: Path | str | None = None) -> tuple[str, str]:
    """(url, branch) of ``repository:`` in ``_config.yml`` (this checkout's by default).

    A small reader for the two keys (the course's helpers do not depend on PyYAML);
    ``tests/test_colab_setup.py`` checks it against PyYAML. The branch defaults to ``main``.
    """
    text = Path(config or _ROOT / "_config.yml").read_text(encoding="utf-8")
    block = re.search(r"^repository:[ \t]*(?:#.*)?\n((?:[ \t]+.*\n?|[ \t]*\n)*)", text, re.M)
    if block is None:
        raise ValueError(f"{config or '_config.yml'}: no repository: section")

    def value(key):
        m = re.search(rf"^[ \t]+{key}:[ \t]*(\"[^\"]*\"|'[^']*'|[^\s#]+)", block.group(1), re.M)
        return m.group(1).strip("\"'") if m else None

    url, branch = value("url"), value("branch") or "main"
    if not url or not _URL_OK.match(url):
        raise ValueError(f"repository.url {url!r} is not a URL git can clone")
    if not _BRANCH_OK.match(branch):
        raise ValueError(f"repository.branch {branch!r} is not a branch name")
    return url.rstrip("/"), branch


def _current() -> tuple[str, str]:
    try:
        return read_repository()
    except (OSError, ValueError):
        return _WRITTEN


#: The course's repository and branch: the checkout's _config.yml, else the written values.
REPOSITORY, BRANCH = _current()


def constraints() -> list[str]:
    """pip constraints that keep the installed CUDA libraries (Colab's torch's) as they are.

    Every installed ``nvidia-*`` wheel and ``torch`` is pinned to its version, so installing
    the course adds what is missing and replaces nothing torch was built with. NVVM is not a
    torch dependency: it is pinned to the installed nvJitLink's CUDA version, because
    nvJitLink assembles only PTX of its own version or older (a newer NVVM's PTX fails).
    """
    pins, nvjitlink = {}, None
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("nvidia-") or name == "torch":
            pins[name] = dist.version
        if name == "nvidia-nvjitlink-cu12":
            nvjitlink = dist.version
    pins.pop(NVVM_WHEEL, None)
    lines = [f"{name}=={version}" for name, version in sorted(pins.items())]
    if nvjitlink:
        major_minor = ".".join(nvjitlink.split(".")[:2])
        lines.append(f"{NVVM_WHEEL}=={major_minor}.*")
    return lines


def check(cc=None) -> str:
    """What the cell runs in a fresh process after the install: gemmlib and gemmcourse
    import, and a kernel compiles to PTX (NVVM) and is assembled to machine code for this
    GPU (or sm_75 without one) by nvJitLink, as every launch will be. Raises on failure."""
    import gemmcourse  # noqa: F401
    import gemmlib
    from gemmlib import backend, ptx
    from gemmlib.kernels import get

    if cc is None:
        cc = backend.device_info().compute_capability if backend.gpu_present() else (7, 5)
    spec = ptx.for_target(get("naive"), cc)
    text = ptx.compile_ptx(spec, cc)
    cubin = ptx.assemble(text, ptx.arch_of(spec, cc))
    if cubin[:4] != b"\x7fELF":
        raise RuntimeError(f"nvJitLink returned no machine code for sm_{cc[0]}{cc[1]}")
    return f"gemmlib {gemmlib.__version__}: sm_{cc[0]}{cc[1]} machine code, {len(cubin)} bytes"


def setup_cell(url: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The first code cell of every chapter, installing from ``url`` at ``branch`` on Colab."""
    return f"""\
# Setup, the same in every chapter. On Colab: fetch the course, install it, check it,
# restart; a step that fails stops here with its error. Without an NVIDIA GPU: use numba's
# CUDA simulator (decided before numba is first imported, hence here).
import importlib.util, os, shutil, subprocess, sys
if ("google.colab" in sys.modules
        and importlib.util.find_spec("gemmlib") is None):
    def step(what, *cmd, **env):
        r = subprocess.run(cmd, capture_output=True, text=True, env={{**os.environ, **env}})
        if r.returncode != 0:
            raise RuntimeError(f"{{what}} failed (exit {{r.returncode}}):\\n{{r.stdout}}{{r.stderr}}")
        return r.stdout
    if not os.path.isdir("{CLONE_DIR}/.git"):
        step("git clone", "git", "clone", "-q", "--depth", "1", "--branch", "{branch}",
             "{url}", "{CLONE_DIR}")
    pins = step("pinning the installed CUDA libraries", sys.executable,
                "{CLONE_DIR}/gemmcourse/colab.py", "constraints")
    with open("{CLONE_DIR}/constraints.txt", "w") as f:
        f.write(pins)
    step("pip install", sys.executable, "-m", "pip", "install", "-q",
         "-c", "{CLONE_DIR}/constraints.txt", "-e", "{CLONE_DIR}[{EXTRAS}]")
    print(step("checking the install", sys.executable, "-m", "gemmcourse.colab", "check",
               NUMBA_ENABLE_CUDASIM="0"), end="")
    raise SystemExit("Installed. Restart the runtime (Runtime > Restart "
                     "session), then run the notebook again from the top.")
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from gemmcourse import notebook as nb
dev = nb.setup()"""


def main(argv=None) -> int:
    """``python gemmcourse/colab.py constraints`` (pins, one a line) or ``... check``."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["constraints"]:
        print("\n".join(constraints()))
    elif args == ["check"]:
        print(check())
    else:
        print("usage: python gemmcourse/colab.py constraints | check", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
