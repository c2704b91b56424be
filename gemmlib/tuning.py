"""Tuning data: which configuration was measured fastest, per GPU and shape class.

The search itself is :mod:`gemmlib.autotune`; this module only reads and
writes its results, so that the dispatch layer (``kernel="auto"``) can use
them without importing the tuner.

Files, most specific first: the user cache (``$GEMMLIB_CACHE`` or
``$XDG_CACHE_HOME/gemmlib`` or ``~/.cache/gemmlib``, ``tuning/<gpu-slug>.json``)
and the tables shipped inside the package (``gemmlib/data/tuning/<gpu-slug>.json``,
package data, so an installed wheel has them too).
A file maps ``kernels -> rung -> shape class -> entry``; an entry has the
rung's ``params`` and, for split-K, the measured ``splits``.  Reads and
writes hold a lock and files are replaced atomically, so threads (and
processes) never see half-written data; an unreadable file counts as absent.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
from importlib import resources
from pathlib import Path

from gemmlib import backend

DEFAULT_KERNEL = "warptile"
_LOCK = threading.RLock()
_MEMO: dict[str, dict] = {}  # path -> parsed file, invalidated by mtime

#: The tables shipped with gemmlib: package data, present in a wheel as in a checkout.
PACKAGE_TUNING_DIR = Path(str(resources.files("gemmlib").joinpath("data", "tuning")))


# --------------------------------------------------------------------------
# Where tuning data lives


def gpu_slug(name: str | None = None) -> str:
    """'NVIDIA H200' -> 'nvidia-h200' (the same slug the benchmark files use)."""
    if name is None:
        name = backend.device_info().name
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def cache_root() -> Path:
    """gemmlib's per-user cache: ``$GEMMLIB_CACHE``, else ``$XDG_CACHE_HOME/gemmlib``."""
    root = os.environ.get("GEMMLIB_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "gemmlib"


def user_cache_dir() -> Path:
    return cache_root() / "tuning"


def cache_paths(slug: str) -> list[Path]:
    """Files consulted for a GPU, most specific first."""
    return [user_cache_dir() / f"{slug}.json", PACKAGE_TUNING_DIR / f"{slug}.json"]


def _read(path: Path) -> dict | None:
    with _LOCK:
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            return None
        memo = _MEMO.get(str(path))
        if memo and memo["mtime"] == mtime:
            return memo["data"]
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        _MEMO[str(path)] = {"mtime": mtime, "data": data}
        return data


def _write(path: Path, data: dict) -> None:
    """Atomic replace: readers see the old file or the new one, never a mix."""
    with _LOCK:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _MEMO.pop(str(path), None)


def update(path: Path, change) -> None:
    """Read the tuning file at ``path`` (empty if absent), let ``change(data)`` edit a private
    copy in place, and replace the file with it -- under the lock, so that concurrent
    updates of one file do not lose each other's entries."""
    with _LOCK:
        data = json.loads(json.dumps(_read(path) or {}))
        change(data)
        _write(path, data)


# --------------------------------------------------------------------------
# Shape classes


def _pow2(x: float) -> int:
    return 1 << max(0, round(math.log2(max(x, 1))))


def shape_class(M: int, N: int, K: int) -> str:
    """The bucket a problem is tuned for: sqrt(M*N) and K, each to the nearest power of two."""
    return f"mn{_pow2(math.sqrt(M * N))}-k{_pow2(K)}"


def token_class(M: int, N: int, K: int) -> str:
    """The bucket of a product at serving sizes: tokens (M), outputs (N) and K, each to the
    nearest power of two -- M kept apart, as the best tile changes with it at a fixed layer."""
    return f"m{_pow2(M)}-n{_pow2(N)}-k{_pow2(K)}"


#: a class name's parts and the weight of each in the distance between classes
_CLASS_FORMS = ((re.compile(r"mn(\d+)-k(\d+)"), (1.0, 0.5)),
                (re.compile(r"m(\d+)-n(\d+)-k(\d+)"), (2.0, 1.0, 1.0)))


def _class_coords(cls: str):
    """(log2 of each part, weights) of a class name, or None."""
    for form, weights in _CLASS_FORMS:
        m = form.fullmatch(cls)
        if m:
            return [math.log2(int(g)) for g in m.groups()], weights
    return None


def nearest_class(cls: str, available) -> str | None:
    """The tuned class closest (in weighted log2 size) to ``cls``."""
    target = _class_coords(cls)
    best, dist = None, math.inf
    for c in available:
        here = _class_coords(c)
        if here is None or target is None or len(here[0]) != len(target[0]):
            continue
        d = sum(w * abs(a - b) for a, b, w in zip(here[0], target[0], target[1]))
        if d < dist:
            best, dist = c, d
    return best


# --------------------------------------------------------------------------
# Lookup


def best_entry(M: int, N: int, K: int, kernel: str = DEFAULT_KERNEL,
               slug: str | None = None, classify=shape_class) -> dict | None:
    """The tuned entry for this GPU and the shape's class (or the nearest tuned class).

    Returns a copy with ``"class"`` and ``"exact"`` (True when the shape's own
    class was tuned) added, or None without tuning data (and in the simulator).
    """
    if backend.SIMULATOR:
        return None
    if slug is None:
        try:
            slug = gpu_slug()
        except Exception:
            return None
    cls = classify(M, N, K)
    for path in cache_paths(slug):
        data = _read(path)
        if not data:
            continue
        classes = data.get("kernels", {}).get(kernel, {})
        if not classes:
            continue
        key = cls if cls in classes else nearest_class(cls, classes)
        if key is not None:
            return dict(classes[key], **{"class": key, "exact": key == cls})
    return None


def best_params(M: int, N: int, K: int, kernel: str = DEFAULT_KERNEL,
                slug: str | None = None) -> dict | None:
    """Tuned parameters for this GPU and the shape's class, or None (use the default)."""
    entry = best_entry(M, N, K, kernel, slug)
    return dict(entry["params"]) if entry else None
