"""gemmlib's import graph has no cycles, and the layers only import downwards.

The layers, bottom to top:

    backend, spec, layout, intrinsics
    -> kernels (the registry and the rung modules)
    -> tuning, diskcache
    -> runtime (select, plans, compile, launch, calls; driver and memory at its foot)
    -> frontends (the caller's arrays: described, checked, made)
    -> paths (product, batched, fp8, repeat)
    -> api; dispatch (the runtime's names where the course knows them)
    -> verify, bench, autotune
    -> cli

The course's helpers (``gemmcourse``: figures, notebook plumbing, probes) sit
above all of it: they import the library, and the library never imports them.

The graph is read from the source with ``ast`` (nothing is imported), and it
counts every import: module-level ones and the lazy ones inside functions, as
well as ``importlib.import_module("gemmlib....")`` with a literal name.  The
only edges left out are those into the top-level ``gemmlib`` package from its
own submodules: its ``__init__`` re-exports the API, so it sits on top of
everything, and ``from gemmlib import backend`` is an edge to
``gemmlib.backend``, not to ``gemmlib``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "gemmlib"
PKG_DIR = ROOT / PKG


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


MODULES = _modules()


def _is_module(name: str) -> bool:
    return name in MODULES


def _resolve_from(base: str, names: list[str]) -> set[str]:
    """``from base import n1, n2``: a submodule where ``base.n`` is one, else ``base``."""
    out = set()
    for n in names:
        out.add(f"{base}.{n}" if n != "*" and _is_module(f"{base}.{n}") else base)
    return out


def _closest_module(name: str) -> str | None:
    """``gemmlib.a.b.c`` -> the longest prefix that is a gemmlib module."""
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if _is_module(cand):
            return cand
        parts.pop()
    return None


def _imports_of(mod: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_pkg = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG or alias.name.startswith(PKG + "."):
                    t = _closest_module(alias.name)
                    if t:
                        targets.add(t)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                pkg_parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                up = node.level - 1
                assert up < len(pkg_parts), f"{mod}: relative import beyond the top package"
                base_parts = pkg_parts[: len(pkg_parts) - up]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != PKG and not base.startswith(PKG + "."):
                continue
            base_mod = _closest_module(base)
            if base_mod is None:
                continue
            if base_mod != base:  # `from gemmlib.x.nosuch import y`: count gemmlib.x
                targets.add(base_mod)
            else:
                targets |= _resolve_from(base, [a.name for a in node.names])
        elif isinstance(node, ast.Call):
            # importlib.import_module("gemmlib.x") / import_module("gemmlib.x")
            f = node.func
            fname = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if (fname == "import_module" and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                    and (node.args[0].value == PKG or node.args[0].value.startswith(PKG + "."))):
                t = _closest_module(node.args[0].value)
                if t:
                    targets.add(t)
    targets.discard(mod)
    # Edges into the top-level package's __init__ from its own submodules are
    # the only ones ignored (every gemmlib module is one of them).
    if mod != PKG:
        targets.discard(PKG)
    return targets


def import_graph() -> dict[str, set[str]]:
    return {mod: _imports_of(mod, path) for mod, path in MODULES.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with a cycle, each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:  # Tarjan (the graph is small: recursion is fine)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for comp in sccs:  # one concrete cycle per component: BFS back to its first node
        members, start = set(comp), comp[0]
        prev = {start: None}
        queue, found = [start], None
        while queue and found is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    found = v
                    break
                if w in members and w not in prev:
                    prev[w] = v
                    queue.append(w)
        path = [found]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        cycles.append(list(reversed(path)) + [start])
    return cycles


def _path(graph: dict[str, set[str]], src: str, dst: str) -> list[str] | None:
    prev = {src: None}
    queue = [src]
    while queue:
        v = queue.pop(0)
        if v == dst:
            path = [v]
            while prev[path[-1]] is not None:
                path.append(prev[path[-1]])
            return list(reversed(path))
        for w in sorted(graph.get(v, ())):
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return None


def test_the_graph_sees_the_imports():
    """A sanity check on the parser itself: a few edges that must be there."""
    g = import_graph()
    assert "gemmlib.kernels.warptile" in g and "gemmlib.intrinsics.index" in g
    assert "gemmlib.backend" in g["gemmlib.runtime.select"]      # from gemmlib import backend
    assert "gemmlib.kernels.warptile" in g["gemmlib.kernels.split_k"]  # from gemmlib.kernels import warptile
    assert "gemmlib.kernels" in g["gemmlib.runtime.select"]      # from gemmlib.kernels import get
    assert "gemmlib.runtime.launch" in g["gemmlib.runtime.calls"]  # import launch from runtime
    assert "gemmlib.verify" in g["gemmlib.cli"]                  # a lazy import inside a function
    assert "gemmlib.api" in g["gemmlib"]                         # the package's own imports count
    assert all("gemmlib" not in targets for mod, targets in g.items() if mod != "gemmlib")


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in gemmlib:\n" + "\n".join(
        "  " + " -> ".join(c) for c in cycles)


KERNEL_MODULES = sorted(m for m in MODULES if m == "gemmlib.kernels" or m.startswith("gemmlib.kernels."))


def _part(package: str) -> list[str]:
    """The modules of ``gemmlib.<package>`` (its face left out), as names under gemmlib."""
    return sorted(m[len(PKG) + 1:] for m in MODULES if m.startswith(f"{PKG}.{package}."))


#: the runtime above its foot (driver, memory): what the kernels never reach
RUNTIME_TOP = ["runtime.select", "runtime.plans", "runtime.compile", "runtime.launch",
               "runtime.calls"]
FORBIDDEN = [(m, ["dispatch", "api", "autotune", "bench", "banks", "verify"] + RUNTIME_TOP)
             for m in KERNEL_MODULES] + [
    ("gemmlib.dispatch", ["api", "autotune", "bench", "verify"] + _part("frontends")
     + _part("paths")),
    ("gemmlib.api", ["autotune", "bench", "verify"]),
] + [(f"{PKG}.{m}", _part("frontends") + _part("paths") + ["api", "dispatch", "verify"])
     for m in _part("runtime")] + [
    (f"{PKG}.{m}", _part("paths") + ["api", "dispatch"]) for m in _part("frontends")] + [
    (f"{PKG}.{m}", ["api", "dispatch"]) for m in _part("paths")]


def test_layering():
    """The lower layers never reach the upper ones, directly or through another module."""
    g = import_graph()
    assert len(KERNEL_MODULES) > 5, KERNEL_MODULES
    bad = []
    for mod, above in FORBIDDEN:
        assert mod in g, mod
        for name in above:
            target = f"{PKG}.{name}"
            assert target in g, target
            path = _path(g, mod, target)
            if path:
                bad.append(" -> ".join(path))
    assert not bad, "layering violations (lower layer imports an upper one):\n" + "\n".join(
        "  " + b for b in bad)


COURSE_DIR = ROOT / "gemmcourse"
#: the modules that are the course, not the library (issue 20: library and course apart)
COURSE_MODULES = {"viz", "viz_tc", "viz_precision", "viz_hopper", "viz_models",
                  "viz_distributed", "notebook", "colab", "plot", "hopper_probe", "mma_roof",
                  "viz_e2e"}


def _mentions_course(path: Path) -> list[str]:
    """Every import of gemmcourse in a file: plain, from-, or import_module("...")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            f = node.func
            if (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) == "import_module":
                names = [node.args[0].value]
        found += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names
                  if n == "gemmcourse" or n.startswith("gemmcourse.")]
    return found


def test_the_library_never_imports_the_course():
    """gemmlib is what a standalone user imports; the course depends on it, not the reverse."""
    bad = [hit for path in MODULES.values() for hit in _mentions_course(path)]
    assert not bad, "gemmlib imports the course helpers:\n  " + "\n  ".join(bad)


def test_the_course_helpers_live_outside_the_library():
    assert not [m for m in COURSE_MODULES if (PKG_DIR / f"{m}.py").exists()]
    assert all((COURSE_DIR / f"{m}.py").exists() for m in COURSE_MODULES)


def test_the_direction_check_sees_a_course_import(tmp_path):
    """The checker itself: an import of the course, in each form, is found."""
    src = tmp_path / "x.py"
    src.write_text("import gemmcourse.viz\nfrom gemmcourse import notebook\n"
                   "def f():\n    import importlib\n    importlib.import_module('gemmcourse.plot')\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert len(_mentions_course(src)) == 3
    finally:
        ROOT = saved
