#!/usr/bin/env python3
"""Write the repository set in ``_config.yml`` into everything that must hold it literally.

    python scripts/set_repository.py            # rewrite what differs, say what changed
    python scripts/set_repository.py --check    # change nothing; exit 1 if anything differs

``_config.yml``'s ``repository.url`` and ``repository.branch`` are the one place the
course's home is set. The book's buttons read them at build time, but a Colab notebook runs
before anything is installed, so each chapter's first code cell must contain the URL itself.
This script writes :func:`gemmcourse.colab.setup_cell` of that URL and branch as the first
code cell of every ``chapters/*.ipynb`` (source and its ``hide-input`` tag; outputs are
kept), and the fallback values in ``gemmcourse/colab.py`` (used by a pip install that has no
``_config.yml``). ``tests/test_colab_setup.py`` fails when they disagree.

Each notebook is read, changed and written back in one step, in the same JSON layout
Jupyter writes (indent 1, UTF-8, the trailing newline as found).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gemmcourse import colab  # noqa: E402  (light: no numba, no gemmlib)

WRITTEN = re.compile(r"^_WRITTEN = \(.*\)$", re.M)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def update_notebook(path: Path, cell: str, check: bool) -> bool:
    """Make ``path``'s first code cell ``cell`` (tagged hide-input); True if it differed."""
    raw = path.read_text(encoding="utf-8")
    nb = json.loads(raw)
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    if not code:
        raise SystemExit(f"{path}: no code cell")
    first = code[0]
    tags = first.setdefault("metadata", {}).get("tags", [])
    same = "".join(first["source"]) == cell and "hide-input" in tags
    if same or check:
        return not same
    first["source"] = _lines(cell)
    if "hide-input" not in tags:
        first["metadata"]["tags"] = tags + ["hide-input"]
    out = json.dumps(nb, indent=1, ensure_ascii=False) + ("\n" if raw.endswith("\n") else "")
    path.write_text(out, encoding="utf-8")
    return True


def update_module(path: Path, url: str, branch: str, check: bool) -> bool:
    text = path.read_text(encoding="utf-8")
    line = f"_WRITTEN = ({url!r}, {branch!r})".replace("'", '"')
    if not WRITTEN.search(text):
        raise SystemExit(f"{path}: no _WRITTEN = (...) line")
    new = WRITTEN.sub(lambda _: line, text, count=1)
    if new != text and not check:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 on a difference")
    ap.add_argument("--root", type=Path, default=ROOT, help="the course's root (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    url, branch = colab.read_repository(root / "_config.yml")
    cell = colab.setup_cell(url, branch)
    changed = []
    for nb in sorted((root / "chapters").glob("*.ipynb")):
        if update_notebook(nb, cell, args.check):
            changed.append(nb.relative_to(root))
    module = root / "gemmcourse" / "colab.py"
    if update_module(module, url, branch, args.check):
        changed.append(module.relative_to(root))
    verb = "differ from" if args.check else "rewritten for"
    print(f"repository {url} (branch {branch}), from _config.yml")
    for p in changed:
        print(f"  {verb}: {p}")
    if not changed:
        print("  every chapter's set-up cell and gemmcourse/colab.py already match")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
