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

This module imports nothing heavy, so the script can use it without numba.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Where the Colab cell clones the repository (Colab's working folder is /content).
CLONE_DIR = "/content/gemm-course"
#: What the Colab cell installs: Colab's GPUs run a CUDA 12 driver.
EXTRAS = "cu12,gpu-cu12"

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


def setup_cell(url: str = REPOSITORY, branch: str = BRANCH) -> str:
    """The first code cell of every chapter, installing from ``url`` at ``branch`` on Colab."""
    return f"""\
# Setup, the same in every chapter. On Colab: fetch the course, install it, restart.
# Without an NVIDIA GPU: use numba's CUDA simulator (this must be decided
# before numba is first imported, hence here).
import importlib.util, os, shutil, sys
if ("google.colab" in sys.modules
        and importlib.util.find_spec("gemmlib") is None):
    !git clone -q --depth 1 --branch {branch} {url} {CLONE_DIR}
    %pip install -q -e "{CLONE_DIR}[{EXTRAS}]"
    raise SystemExit("Installed. Restart the runtime (Runtime > Restart "
                     "session), then run the notebook again from the top.")
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from gemmcourse import notebook as nb
dev = nb.setup()"""
