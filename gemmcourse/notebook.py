"""Helpers every chapter notebook uses.

The first code cell of each chapter is the same few lines (``gemmcourse.colab.setup_cell``,
written into every chapter from ``_config.yml`` by ``scripts/set_repository.py``)::

    import importlib.util, os, shutil, sys
    if ("google.colab" in sys.modules
            and importlib.util.find_spec("gemmlib") is None):   # Colab: install, restart
        !git clone -q --depth 1 --branch <branch> <repository> /content/gemm-course
        %pip install -q -e "/content/gemm-course[cu12,gpu-cu12]"
        raise SystemExit("Installed. Restart the runtime ...")
    if shutil.which("nvidia-smi") is None:            # no NVIDIA GPU: simulate one
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    from gemmcourse import notebook as nb
    dev = nb.setup()

:func:`setup` then checks what a fresh Colab runtime gets wrong (numba-cuda
installed but not yet active: restart needed), prints the device the
notebook runs on, and styles the figures.  Everything else here sizes
problems for the device (tiny in the simulator, real on a GPU), shows kernel
source from gemmlib, reads committed benchmark results, measures live when a
GPU is present, and checks the readers' exercise answers.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import re
import sys
import textwrap
from pathlib import Path

from gemmlib import backend
from gemmlib.backend import SIMULATOR

# The course's repository and branch, as _config.yml sets them (gemmcourse.colab): what
# every chapter's set-up cell installs from on Colab (tests/test_colab_setup.py checks).
from gemmcourse.colab import BRANCH, REPOSITORY  # noqa: F401

IN_COLAB = "google.colab" in sys.modules


class RestartRuntime(RuntimeError):
    """numba-cuda was installed into a running interpreter: restart it, then re-run."""


# --------------------------------------------------------------------------
# Setup


def numba_cuda_active() -> bool:
    """True when ``numba.cuda`` is NVIDIA's numba-cuda package (not numba's old built-in target)."""
    try:
        import numba.cuda as nc
    except Exception:
        return False
    return getattr(nc, "implementation", None) == "NVIDIA"


def setup(quiet: bool = False):
    """Check the environment, print where kernels will run, return its DeviceInfo."""
    if IN_COLAB and not SIMULATOR and not numba_cuda_active():
        msg = ("numba-cuda was just installed, but this Python process started with Colab's "
               "own numba. Restart the runtime (Runtime > Restart session), then run the "
               "notebook again from the top; the install step will be skipped.")
        print("*** " + msg)
        raise RestartRuntime(msg)
    _style_figures()
    if not SIMULATOR and not backend.gpu_present():
        raise backend.NoGPUError(
            "no CUDA GPU is visible. On Colab: Runtime > Change runtime type > T4 GPU. "
            "Elsewhere: set NUMBA_ENABLE_CUDASIM=1 before the first import to use numba's "
            "CUDA simulator (tiny problem sizes, no timings).")
    dev = backend.device_info()
    if not quiet:
        print(environment_summary())
    return dev


def describe_device(dev=None) -> str:
    dev = dev or backend.device_info()
    if dev.simulated:
        return ("Device: numba's CUDA SIMULATOR (NUMBA_ENABLE_CUDASIM=1)\n"
                "        every CUDA thread is a Python thread: tiny sizes, no timings")
    cc = ".".join(map(str, dev.compute_capability))
    return (f"GPU: {dev.name}\n"
            f"     compute capability {cc}, {dev.sm_count} SMs, "
            f"{dev.max_sm_clock_mhz:.0f} MHz, fp32 peak {dev.fp32_peak_tflops:.1f} TFLOP/s")


def _style_figures():
    try:
        import matplotlib.pyplot as plt

        plt.rcParams.update({"figure.dpi": 100, "savefig.dpi": 100, "font.size": 10,
                             "axes.titlesize": 10})
    except Exception:  # pragma: no cover
        pass


def on_gpu() -> bool:
    return not SIMULATOR and backend.gpu_present()


# --------------------------------------------------------------------------
# Problem sizes: tiny in the simulator, real on a GPU


def demo_shape() -> tuple[int, int, int]:
    """One (M, N, K) for a chapter's first run: odd, so every edge case is hit (in the
    simulator K = 13: a partial k-tile, two of 8; each k-tile is a pass of every thread)."""
    return (23, 29, 13) if SIMULATOR else (1000, 1001, 999)


def verify_shapes(spec=None) -> list[tuple[int, int, int]]:
    """Shapes for a chapter's correctness check.

    In the simulator: two shapes that each fit in one or two blocks (a
    1024-thread block costs a second or two there), one with partial tiles, one with
    K over a 64-wide k-tile.  On a GPU: single elements, off-tile sizes on both sides
    of the tile, and a large square.
    """
    if SIMULATOR:
        return [(23, 29, 13), (3, 5, 70)]
    tm, tn = spec.tile if spec is not None else (32, 32)
    return [(1, 1, 1), (tm + 1, tn - 1, 7), (127, 129, 65), (1000, 1001, 999),
            (2048, 2048, 2048)]


def live_shapes() -> list[tuple[int, int, int]]:
    """Square sizes measured live in a chapter (kept quick: seconds, not minutes)."""
    return [] if SIMULATOR else [(n, n, n) for n in (512, 1024, 2048)]


def gemm_flops(M: int, N: int, K: int) -> int:
    """A multiply and an add for every (i, j, k)."""
    return 2 * M * N * K


# --------------------------------------------------------------------------
# Device facts


def memory_bandwidth_gbs():
    """Peak DRAM bandwidth read from the driver (GB/s); None in the simulator."""
    if SIMULATOR or not backend.gpu_present():
        return None
    return backend.device_info().peak_bandwidth_gbs


def runnable(spec) -> bool:
    """True if this device can run ``spec``; otherwise prints why and returns False."""
    dev = backend.device_info()
    if tuple(dev.compute_capability) < tuple(spec.min_cc):
        need = f"sm_{spec.min_cc[0]}{spec.min_cc[1]}"
        have = f"sm_{dev.compute_capability[0]}{dev.compute_capability[1]}"
        why = getattr(spec, "min_cc_why", "")
        print(f"SKIPPED: kernel {spec.name!r} needs {need} or newer; this GPU ({dev.name}) "
              f"is {have}{': ' + why if why else ''}. The rest of the chapter still runs.")
        return False
    failed = spec.failed_constraints(256, 256, 256, dev)   # what no shape can fix
    if failed:
        print(f"SKIPPED: kernel {spec.name!r} cannot run on this GPU ({dev.name}): "
              f"{failed[0]}. The rest of the chapter still runs.")
        return False
    return True


#: A word this long may break after its underscores and dots (see :func:`_cell_html`).
_BREAKABLE = re.compile(r"\S{12,}")


def _cell_html(value) -> str:
    """A cell's text, escaped; a long word (a spec name such as
    ``split_k_128x256x16_w64x64n2_t8x4_p0_s4``, a PTX instruction, ``torch.matmul``) may
    break after its underscores and after a dot that a letter follows (``<wbr>``), so one
    such word does not push the table past the text column.  The browser breaks there
    only when the column would not fit otherwise."""
    return _BREAKABLE.sub(lambda m: re.sub(r"(_|\.(?=[^\d.]))", r"\1<wbr>", m.group()),
                          html.escape(str(value)))


def _html_table(header, rows, caption=None):
    out = ["<table style='border-collapse:collapse;font-size:0.9em'>"]
    if caption:
        out.append(f"<caption style='text-align:left'>{html.escape(caption)}</caption>")
    out.append("<tr>" + "".join(f"<th style='text-align:left;padding:2px 10px;"
                                f"border-bottom:1px solid #999'>{_cell_html(h)}</th>"
                                for h in header) + "</tr>")
    for r in rows:
        out.append("<tr>" + "".join(f"<td style='padding:2px 10px'>{_cell_html(c)}</td>"
                                    for c in r) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


class Table:
    """A small table that renders as HTML in notebooks and as text elsewhere."""

    def __init__(self, header, rows, caption=None):
        self.header, self.rows, self.caption = list(header), [list(r) for r in rows], caption

    def _repr_html_(self):
        return _html_table(self.header, self.rows, self.caption)

    def __repr__(self):
        widths = [max(len(str(x)) for x in col) for col in zip(self.header, *self.rows)]
        line = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths))  # noqa: E731
        body = [line(self.header)] + [line(r) for r in self.rows]
        return "\n".join(([self.caption] if self.caption else []) + body)


class Tables(tuple):
    """Several :class:`Table` s shown one under the other by one ``display`` call: a wide
    record split so that each part fits the text column."""

    def _repr_html_(self):
        return "\n".join(t._repr_html_() for t in self)

    def __repr__(self):
        return "\n\n".join(map(repr, self))


def hardware_table(spec=None) -> Table:
    """The device limits that matter for GEMM, read from the driver.  Chapter 1 shows it;
    the other chapters link there and show only :func:`kernel_table` (with ``spec`` the
    kernel's rows are appended here too)."""
    dev = backend.device_info()
    kib = lambda b: f"{b / 1024:.0f} KiB"  # noqa: E731
    rows = [
        ("GPU", dev.name),
        ("compute capability", ".".join(map(str, dev.compute_capability))),
        ("streaming multiprocessors (SMs)", dev.sm_count),
        ("warp size", dev.warp_size),
        ("max threads per block", dev.max_threads_per_block),
        ("max threads per SM", dev.max_threads_per_sm),
        ("shared memory per block (default / opt-in)",
         f"{kib(dev.max_shared_per_block)} / {kib(dev.max_shared_per_block_optin)}"),
        ("shared memory per SM", kib(dev.max_shared_per_sm)),
        ("32-bit registers per SM", dev.registers_per_sm),
        ("L2 cache", kib(dev.l2_bytes) if dev.l2_bytes else "n/a"),
        ("max SM clock", f"{dev.max_sm_clock_mhz:.0f} MHz" if dev.max_sm_clock_mhz else "n/a"),
        ("fp32 FMA peak", f"{dev.fp32_peak_tflops:.1f} TFLOP/s" if dev.fp32_peak_tflops else "n/a"),
    ]
    bw = memory_bandwidth_gbs()
    rows.append(("DRAM bandwidth (peak)", f"{bw:.0f} GB/s" if bw else "n/a"))
    if spec is not None:
        rows += [(f"[{spec.name}] {k}", v) for k, v in kernel_table(spec, dev).rows]
    src = "numba simulator (placeholder values)" if dev.simulated else "read from the driver"
    return Table(("property", "value"), rows, caption=f"Device facts ({src})")


def kernel_table(spec, dev=None, registers=None) -> Table:
    """What one block of ``spec`` asks of an SM, and how many blocks fit on one.

    The device's own limits are chapter 1's table (:func:`hardware_table`).  Registers per
    thread are the compiler's: on a GPU, the driver's figure for the kernel gemmlib loaded;
    in the simulator nothing is compiled, and the row says how to get the figure offline.
    """
    dev = dev or backend.device_info()
    regs = registers if registers is not None else registers_per_thread(spec)
    cc = "".join(map(str, dev.compute_capability))
    rows = [("threads per block", f"{spec.threads} {tuple(spec.block)}"),
            ("static shared memory per block", f"{spec.shared_bytes} B"),
            ("registers per thread",
             f"{regs} (compiled for sm_{cc})" if regs else
             f"not known in the simulator (python -m gemmlib.ptx {spec.name} compiles the "
             "kernel without a GPU and prints it)"),
            ("blocks per SM, limited by",
             ", ".join(f"{k}: {v}" for k, v in blocks_per_sm(spec, regs, dev).items()))]
    return Table(("property", "value"), rows, caption=f"Kernel {spec.name} on {dev.name}")


def registers_per_thread(spec):
    """Registers per thread the compiler gave the kernel, as the driver reports them for the
    kernel gemmlib loads (None in the simulator)."""
    if SIMULATOR:
        return None
    try:
        from gemmlib.autotune import compiled_resources

        regs = compiled_resources(spec).get("registers")
        return int(regs) if regs else None
    except Exception:
        return None


def blocks_per_sm(spec, regs=None, dev=None) -> dict:
    """How many blocks of ``spec`` one SM can hold, by each resource."""
    dev = dev or backend.device_info()
    fit = {"threads": dev.max_threads_per_sm // spec.threads}
    if spec.shared_bytes:
        # the driver reserves 1 KiB of shared memory per block on sm_80+
        fit["shared memory"] = dev.max_shared_per_sm // (spec.shared_bytes + 1024)
    if regs:
        per_warp = -(-regs * 32 // 256) * 256  # allocated in units of 256 per warp
        fit["registers"] = dev.registers_per_sm // (per_warp * -(-spec.threads // 32))
    return fit


# --------------------------------------------------------------------------
# Source code, straight from gemmlib


def _source_of(obj) -> str:
    from gemmlib.kernels import LADDER, module as kernel_module
    from gemmlib.spec import KernelSpec

    if isinstance(obj, str):
        if obj in LADDER:
            return inspect.getsource(kernel_module(obj))
        return inspect.getsource(importlib.import_module(obj))
    if isinstance(obj, KernelSpec):
        obj = obj.kernel
    for attr in ("py_func", "fn", "_func"):  # numba dispatcher / simulator kernel
        inner = getattr(obj, attr, None)
        if callable(inner):
            obj = inner
            break
    return textwrap.dedent(inspect.getsource(obj))


def show_source(obj, *, start: str | None = None, stop: str | None = None):
    """Display the source of a kernel, function, spec, module or rung name, highlighted.

    ``start`` / ``stop``: show only from the first line containing ``start``
    up to (excluding) the first later line containing ``stop``.
    """
    src = _source_of(obj)
    if start or stop:
        lines = src.splitlines()
        i = next((n for n, ln in enumerate(lines) if start and start in ln), 0)
        j = next((n for n, ln in enumerate(lines) if stop and n > i and stop in ln), len(lines))
        src = textwrap.dedent("\n".join(lines[i:j]))
    try:
        from IPython.display import Code, display

        display(Code(src.rstrip() + "\n", language="python"))
    except ImportError:  # pragma: no cover - outside IPython
        print(src)


# --------------------------------------------------------------------------
# Committed results (results/*.json written by `python -m gemmlib bench --out results`)


_NO_CHECKOUT_SAID = False


def repo_root() -> Path | None:
    """The checkout's root (the folder holding results/), or None when gemmlib was pip-installed
    without it (then says once that the committed measurements are not here, and where they are)."""
    global _NO_CHECKOUT_SAID
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            if (d / "gemmlib").is_dir() and (d / "pyproject.toml").is_file():
                return d
    if not _NO_CHECKOUT_SAID:
        _NO_CHECKOUT_SAID = True
        print(f"(gemmcourse is installed without the course's checkout, so the measurements "
              f"committed in its results/ and figures/ are not shown here. To see them, clone "
              f"{REPOSITORY} and install from the clone: pip install -e <clone>, as the "
              f"chapters' set-up cell does on Colab.)")
    return None


def load_results(kernels=None, *, call: bool = False):
    """Every committed benchmark result (newest last), as gemmlib.bench.Result objects.

    Simulator runs carry no timings and are left out.  The ladder's kernel sweeps
    by default; ``call=True``: the files with call-level rows (``bench-*-call.json``).
    """
    root = repo_root()
    if root is None or not (root / "results").is_dir():
        return []
    try:
        from gemmlib.bench import load
    except ImportError:
        return []
    out = []
    for p in sorted((root / "results").glob("bench-*.json")):
        if (p.name.endswith(("-precision.json", "-hopper.json"))   # other row formats
                or p.name.endswith("-call.json") != call):
            continue
        try:
            r = load(p)
        except Exception as e:  # a malformed or foreign file: say so, keep going
            print(f"(skipping {p.name}: {e})")
            continue
        if r.meta.get("simulated"):
            continue
        r.meta.setdefault("file", p.name)
        out.append(r)
    return sorted(out, key=lambda r: r.meta.get("date", ""))


def pick_result(results=None):
    """The result to show: the newest one from this GPU if there is one, else the newest."""
    results = load_results() if results is None else results
    if not results:
        return None
    if on_gpu():
        here = backend.device_info().name
        mine = [r for r in results if r.meta.get("gpu") == here]
        if mine:
            return mine[-1]
    return results[-1]


NO_RESULTS = ("No committed results yet: they appear here once `python -m gemmlib bench "
              "--out results` has run on a GPU and results/*.json is committed.")


def results_table(kernels=None, *, squares_only=True, result=None):
    """A table of committed timings: TFLOP/s and % of cuBLAS for ``kernels`` (default all).

    ``squares_only``: True for the M = N = K rows, False for the others (the
    rectangular and odd shapes), None for every row.  Returns a :class:`Table`
    (or prints a message and returns None when there are no committed results).
    """
    result = result or pick_result()
    if result is None:
        print(NO_RESULTS)
        return None
    rows = [r for r in result.rows if kernels is None or r.kernel in kernels or
            r.kernel == "cublas"]
    if squares_only is not None:
        rows = [r for r in rows if (r.M == r.N == r.K) == squares_only]
    order = {k: i for i, k in enumerate(list(kernels or []) + ["cublas"])}
    rows.sort(key=lambda r: (r.M, r.N, r.K, order.get(r.kernel, -1)))
    body = [(r.kernel, f"{r.M}x{r.N}x{r.K}", f"{r.median_ms:.3f}", f"{r.tflops:.2f}",
             f"{r.pct_of_cublas:.1f}%") for r in rows]
    m = result.meta
    cap = (f"Committed results: {m.get('gpu', '?')}, {m.get('date', '')[:10]}, "
           f"{m.get('precision', 'float32')} ({m.get('file', '')})")
    if on_gpu() and m.get("gpu") != backend.device_info().name:
        cap += f" -- measured on a different GPU than this one ({backend.device_info().name})"
    return Table(("kernel", "M x N x K", "median ms", "TFLOP/s", "% of cuBLAS"), body, cap)


#: The ladder chapter by chapter: (chapter, rung, precision, the rung it is measured against).
#: ``auto`` is what gemmlib.matmul runs (chapter 13); the layout line of chapters 10-12
#: restarts from the scalar 2D-tiled kernel; the tensor-core rungs are compared in fp16.
LADDER_STEPS = (
    ("03", "naive", "fp32", None),
    ("04", "coalesced", "fp32", "naive"),
    ("05", "shared", "fp32", "coalesced"),
    ("06", "blocktile_1d", "fp32", "shared"),
    ("06", "blocktile_2d", "fp32", "blocktile_1d"),
    ("07", "vectorized", "fp32", "blocktile_2d"),
    ("08", "bank_free", "fp32", "vectorized"),
    ("09", "warptile", "fp32", "bank_free"),
    ("10", "layout_nt", "fp32", "blocktile_2d"),
    ("11", "async_copy", "fp32", "layout_nt"),
    ("12", "double_buffer", "fp32", "async_copy"),
    ("13", "auto", "fp32", "warptile"),
    ("14", "mma_atom", "fp16", None),
    ("15", "mma_swizzle", "fp16", None),
    ("16", "mma_pipeline", "fp16", None),
    ("17", "wgmma_ws", "fp16", "mma_pipeline"),
)

#: Where each rung's timing is committed: the fp32 sweep, the precision benchmark (whose
#: ``auto`` ran the tuned mma_pipeline) or the Hopper benchmark.
_LADDER_SOURCE = {"mma_pipeline": ("precision", "auto"), "wgmma_ws": ("hopper", "wgmma_ws")}


def _newest(pattern: str, directory=None):
    files = [(n, d) for n, d in committed_json(pattern, directory)
             if isinstance(d, dict) and not d.get("meta", {}).get("simulated")]
    return max(files, key=lambda f: (str(f[1]["meta"].get("date", "")), f[0]), default=(None, None))


def ladder_gpus(directory=None) -> list[str]:
    """The GPUs (file-name slugs) with a committed fp32 ladder sweep."""
    import re

    found = (re.fullmatch(r"bench-(.+)-\d{4}-\d\d-\d\d\.json", n)
             for n, _ in committed_json("bench-*.json", directory))
    return sorted({m.group(1) for m in found if m})


def ladder_records(slug: str, n: int = 4096, directory=None) -> list[dict]:
    """One record per step of :data:`LADDER_STEPS` on GPU ``slug`` at n x n x n, kernel
    timing: TFLOP/s, % of cuBLAS in the same precision, and the gain over the rung it is
    measured against (taken from the same run); ``tflops`` is None for a rung never timed."""
    files = {
        "fp32": _newest(f"bench-{slug}-????-??-??.json", directory),
        "precision": _newest(f"bench-{slug}-*-precision.json", directory),
        "hopper": _newest(f"bench-{slug}-*-hopper.json", directory),
    }

    def row(data, kernel, precision):
        for r in (data or {}).get("rows", []):
            if (r.get("kernel") == kernel and r.get("M") == r.get("N") == r.get("K") == n
                    and r.get("timing", "kernel") in (None, "kernel")
                    and r.get("precision", "fp32") in (precision, None)):
                return r
        return None

    out = []
    for chapter, rung, precision, prev in LADDER_STEPS:
        source, kernel = _LADDER_SOURCE.get(rung, ("fp32", rung))
        name, data = files[source]
        r = row(data, kernel, precision)
        before = row(data, prev, precision) if prev else None   # the same run's row
        out.append(dict(
            chapter=chapter, rung=rung, precision=precision, previous=prev,
            tflops=r["tflops"] if r else None, pct=r["pct_of_cublas"] if r else None,
            gain=r["tflops"] / before["tflops"] if r and before else None,
            gpu=(data or {}).get("meta", {}).get("gpu"), file=name if r else None))
    return out


def ladder_table(slug: str, n: int = 4096, directory=None) -> Table:
    """The running ladder on one GPU: every chapter's rung at n^3 (see :func:`ladder_records`)."""
    recs = ladder_records(slug, n, directory)
    body = [(d["chapter"], d["rung"], d["precision"],
             "not timed" if d["tflops"] is None else f"{d['tflops']:.2f}",
             "-" if d["pct"] is None else f"{d['pct']:.1f}%",
             f"{d['gain']:.2f}x {d['previous']}" if d["gain"] else "-")
            for d in recs]
    gpu = next((d["gpu"] for d in recs if d["gpu"]), slug)
    return Table(("chapter", "rung", "precision", "TFLOP/s", "% of cuBLAS", "gain over"), body,
                 caption=f"The ladder on {gpu} at {n}x{n}x{n}, kernel timing; cuBLAS in the same "
                         "precision and run (fp32 with TF32 off)")


def figure(name: str, fallback=None):
    """Show figures/<name> if the lead's `python -m gemmcourse plot` made it; otherwise call
    ``fallback()`` (which may draw the chart inline) or say it is not there yet."""
    root = repo_root()
    path = root / "figures" / name if root else None
    if path is not None and path.is_file():
        from IPython.display import Image, display

        display(Image(filename=str(path)))
        return True
    if fallback is not None:
        fallback()
    else:
        print(f"(figure {name} not generated yet: run `python -m gemmcourse plot` after a benchmark)")
    return False


def performance(kernels, *, title=None):
    """Committed results for ``kernels`` against cuBLAS: a table, then a chart.

    Then, on a GPU, a quick live measurement (see :func:`measure_live`).
    """
    from IPython.display import display

    result = pick_result()
    if result is None:
        print(NO_RESULTS)
    else:
        table = results_table(kernels, result=result)
        display(table)
        results_chart(result, kernels, title)
    if on_gpu():
        measure_live(kernels)
    else:
        print("Live measurement skipped: " + ("the simulator runs kernels as Python threads, "
              "so its timings mean nothing." if SIMULATOR else "no GPU."))


def results_chart(result, kernels, title=None):
    import matplotlib.pyplot as plt

    from gemmcourse.viz import plot_results

    recs = [dict(kernel=r.kernel, M=r.M, N=r.N, K=r.K, tflops=r.tflops) for r in result.rows
            if r.M == r.N == r.K]
    fig = plot_results(recs, kernels=kernels,
                       title=title or f"{', '.join(kernels)} vs cuBLAS on {result.meta.get('gpu')}")
    plt.show()
    return fig


def measure_live(kernels, shapes=None, reps: int = 10):
    """Time ``kernels`` and cuBLAS now, on this GPU, with gemmlib.bench (if available)."""
    if not on_gpu():
        print("Live measurement needs a GPU.")
        return None
    try:
        from gemmlib.bench import benchmark
    except ImportError as e:
        print(f"Live measurement unavailable: gemmlib.bench could not be imported ({e}).")
        return None
    runnable_kernels = []
    from gemmlib.kernels import get

    skipped = []
    for k in kernels:
        if get(k).precision != "fp32":   # tensor-core rungs: timed per precision elsewhere
            skipped.append(k)
        elif runnable(get(k)):
            runnable_kernels.append(k)
    if skipped:
        print(f"(not timed here, in fp32: {', '.join(skipped)} -- their default precision is "
              f"not fp32; chapters 14-18 time them against cuBLAS in their own precision)")
    if not runnable_kernels:
        return None
    shapes = shapes or live_shapes()
    print(f"Measuring {', '.join(runnable_kernels)} and cuBLAS live on {backend.device_info().name}"
          f" at {', '.join('x'.join(map(str, s)) for s in shapes)} ...")
    result = benchmark(runnable_kernels, shapes, reps=reps, warmup=2, budget_s=3.0,
                       progress=False)
    print(result.table())
    return result


# --------------------------------------------------------------------------
# Exercises: automatic checks that print a verdict and never raise


def _verdict(ok: bool, message: str) -> bool:
    print(("[correct] " if ok else "[not yet] ") + message)
    return ok


def check_value(answer, expected, what: str, rel: float = 1e-9) -> bool:
    """Compare a number (or anything comparable) with the expected one."""
    if answer is None or answer is Ellipsis:
        return _verdict(False, f"{what}: replace the placeholder with your answer.")
    if isinstance(expected, bool):  # a yes/no check computed by the cell
        return _verdict(bool(answer) == expected, what if bool(answer) == expected
                        else f"{what}: not right yet. Look at the hint and try again.")
    ok = _same(answer, expected, rel)
    return _verdict(ok, f"{what} = {expected}" if ok else f"{what}: you have {answer!r}, "
                    "which is not it. Look at the hint and try again.")


def _same(answer, expected, rel: float) -> bool:
    """Numbers within ``rel`` (relative, at least 1 absolute), anything else equal."""
    try:
        return abs(float(answer) - float(expected)) <= rel * max(1.0, abs(float(expected)))
    except (TypeError, ValueError):
        return answer == expected


def check_hidden(answer, expected, what: str, rel: float = 1e-9) -> bool:
    """Like :func:`check_value`, but the verdict never shows the expected value (the
    exercise checks of :mod:`gemmcourse.exercises`)."""
    if answer is None or answer is Ellipsis:
        return _verdict(False, f"{what}: replace the placeholder with your answer.")
    ok = _same(answer, expected, rel)
    return _verdict(ok, f"{what}: right." if ok else f"{what}: you have {answer!r}, which is "
                    "not it. Look at the hint and try again.")


def check_function(candidate, reference, cases, what: str) -> bool:
    """Call ``candidate`` and ``reference`` on every argument tuple in ``cases``; report the
    first disagreement."""
    n = 0
    for args in cases:
        try:
            got = candidate(*args)
        except NotImplementedError:
            return _verdict(False, f"{what}: not written yet.")
        except Exception as e:  # the reader's bug: show it, do not raise
            return _verdict(False, f"{what}{args} raised {type(e).__name__}: {e}")
        want = reference(*args)
        try:
            same = tuple(got) == tuple(want) if isinstance(want, tuple) else got == want
        except TypeError:
            same = False
        if not same:
            return _verdict(False, f"{what}{args} gives {got}, expected {want}.")
        n += 1
    return _verdict(True, f"{what} agrees on all {n} cases.")


def check_index_function(candidate, spec, M: int = 70, N: int = 45) -> bool:
    """Compare a reader's c_element(block_x, block_y, thread_x, thread_y) with the kernel's
    own, for every thread of the launch that covers an M x N matrix C."""
    gx, gy, _ = spec.grid(M, N, 1)
    bx, by = spec.block[:2]
    cases = [(i, j, tx, ty) for j in range(gy) for i in range(gx)
             for ty in range(by) for tx in range(bx)]
    return check_function(candidate, spec.index["c_element"], cases,
                          f"c_element for kernel {spec.name!r}")


def check_matmul(candidate, what: str = "your matmul", shapes=((3, 4, 5), (7, 2, 6), (1, 1, 1))) -> bool:
    """Run a reader's CPU matmul(A, B) on small random matrices and compare with NumPy."""
    import numpy as np

    rng = np.random.default_rng(1)
    for M, N, K in shapes:
        A = rng.uniform(-1, 1, (M, K)).astype(np.float32)
        B = rng.uniform(-1, 1, (K, N)).astype(np.float32)
        try:
            got = np.asarray(candidate(A, B), dtype=np.float64)
        except NotImplementedError:
            return _verdict(False, f"{what}: not written yet.")
        except Exception as e:
            return _verdict(False, f"{what} raised {type(e).__name__}: {e}")
        want = A.astype(np.float64) @ B.astype(np.float64)
        if got.shape != want.shape:
            return _verdict(False, f"{what} returned shape {got.shape}, expected {want.shape}.")
        if not np.allclose(got, want, rtol=1e-4, atol=1e-5):
            i, j = np.unravel_index(np.abs(got - want).argmax(), want.shape)
            return _verdict(False, f"{what} is wrong at C[{i}, {j}] for {M}x{N}x{K}: "
                            f"{got[i, j]:.5f} instead of {want[i, j]:.5f}.")
    return _verdict(True, f"{what} matches NumPy on {len(shapes)} shapes.")


def environment_summary() -> str:
    """Where and with what the notebook ran (printed by :func:`setup`)."""
    from importlib import metadata

    def v(d):
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            return "-"

    import numpy as np

    return (f"{describe_device()}\n"
            f"Software: numba-cuda {v('numba-cuda')}, numba {v('numba')}, "
            f"NumPy {np.__version__}, Python {sys.version.split()[0]}"
            + (", on Colab" if IN_COLAB else ""))


def time_cublas(n: int, reps: int = 10) -> float | None:
    """Median milliseconds of cuBLAS SGEMM (CuPy's matmul, TF32 off) on n x n x n, timed
    the benchmark harness's way; None without a GPU."""
    if not on_gpu():
        return None
    import numpy as np

    from gemmlib.bench import time_fn

    A = backend.random_matrix((n, n), np.float32, 0)
    B = backend.random_matrix((n, n), np.float32, 1)
    C = backend.cublas_matmul(A, B)
    return time_fn(lambda: backend.cublas_matmul(A, B, out=C), reps).median


def roofline(points, title=None):
    """The roofline of this GPU (peak and bandwidth read from the driver) with ``points``
    ((label, FLOP per byte, measured TFLOP/s or None)).  In the simulator there is no
    device to read, so an imaginary 20 TFLOP/s, 500 GB/s GPU is drawn, labelled as such."""
    import matplotlib.pyplot as plt

    from gemmcourse.viz import plot_roofline

    dev = backend.device_info()
    bw = memory_bandwidth_gbs()
    if dev.simulated or not bw:
        fig = plot_roofline(20.0, 500.0, points,
                            title="roofline of an imaginary GPU (20 TFLOP/s, 500 GB/s)",
                            note="simulator: illustrative numbers, not a real device")
    else:
        fig = plot_roofline(dev.fp32_peak_tflops, bw, points, title=title or (
            f"roofline of this {dev.name}: {dev.fp32_peak_tflops:.1f} TFLOP/s fp32, "
            f"{bw:.0f} GB/s"))
    plt.show()
    return fig


def ptx_evidence(spec, patterns, examples: int = 2):
    """Count PTX instructions matching each regular expression in the compiled kernel.

    The proof that a rung does what its chapter claims ("16-byte loads", "cp.async")
    is in the compiler's output.  On a GPU the kernel's PTX is read after it has
    been compiled (run a check first); the simulator compiles nothing, so this
    says where to look instead.
    """
    import re

    if SIMULATOR:
        print("The simulator compiles nothing, so there is no PTX to show here. On a GPU this "
              "cell counts the instructions; on any machine with numba-cuda[cu13], "
              "`python -m gemmlib.ptx` (the compile gate) checks them for sm_75/80/90.")
        return None
    try:
        asm = spec.kernel.inspect_asm()
        if isinstance(asm, dict) and not asm:
            # gemmlib launched it from its own cubin cache, so numba holds no PTX for it:
            # compile it for this GPU, as the compile gate does
            from gemmlib import ptx

            asm = ptx.compile_ptx(spec, tuple(backend.device_info().compute_capability))
    except Exception as e:
        print(f"PTX not available ({type(e).__name__}: {e}); run the kernel once first.")
        return None
    text = next(iter(asm.values())) if isinstance(asm, dict) else str(asm)
    rows = []
    for pat in patterns:
        hits = [ln.strip() for ln in text.splitlines() if re.search(pat, ln)]
        rows.append((pat, len(hits), " | ".join(hits[:examples])))
    return Table(("pattern", "count in PTX", "examples"), rows,
                 caption=f"PTX of {spec.name} compiled for this GPU")


def committed_json(pattern: str, directory=None):
    """[(file name, parsed JSON)] for committed files matching ``pattern`` under results/
    (e.g. "layouts-*.json", "tuning/*-tune.json"), or under ``directory`` (e.g.
    ``gemmlib.tuning.PACKAGE_TUNING_DIR``: the tuning tables); empty when none."""
    import json

    if directory is None:
        root = repo_root()
        if root is None:
            return []
        directory = root / "results"
    out = []
    for p in sorted(Path(directory).glob(pattern)):
        try:
            out.append((p.name, json.loads(p.read_text())))
        except (OSError, ValueError) as e:
            print(f"(skipping {p.name}: {e})")
    return out


# --------------------------------------------------------------------------
# Chapter 13: the host cost of a call, and call-level results against cuBLAS

NO_CALL_DATA = "no committed call-level measurement found"


def _newest_per_gpu(files):
    """Keep the newest file per GPU (by meta date, then name), in GPU-name order."""
    best = {}
    for name, data in files:
        if not isinstance(data, dict) or data.get("meta", {}).get("simulated"):
            continue
        meta = data.get("meta", {})
        gpu = meta.get("gpu_slug") or meta.get("gpu") or name
        key = (str(meta.get("date", "")), name)
        if gpu not in best or key > best[gpu][0]:
            best[gpu] = (key, name, data)
    return [(name, data) for _, (_, name, data) in sorted(best.items())]


def host_cost_files(directory=None):
    """The newest ``host-cost-<gpu>-<date>.json`` per GPU: [(file name, data)]."""
    return _newest_per_gpu(committed_json("host-cost-*.json", directory))


def host_cost_tables(data: dict, name: str = ""):
    """Two :class:`Table` s of one host-cost record: whole calls, and the steps of one call."""
    meta = data.get("meta", {})
    shape = "x".join(str(v) for v in data.get("shape", []))
    where = f"{meta.get('gpu', '?')}, {str(meta.get('date', ''))[:10]}, {shape}"
    if data.get("calls"):
        where += f", median of {data['calls']} calls"
    rows = [(r.get("name", "?"), f"{float(r.get('host_us', float('nan'))):.1f}",
             r.get("what", "")) for r in data.get("rows", [])]
    calls = Table(("call", "host us", "what it does"), rows,
                  caption=f"Host time per call: {where} ({name})")
    steps = data.get("steps", [])
    total = sum(float(s.get("host_us", 0.0)) for s in steps)
    srows = [(s.get("step", "?"), f"{float(s.get('host_us', 0.0)):.2f}",
              f"{100.0 * float(s.get('host_us', 0.0)) / total:.0f}%" if total else "-")
             for s in steps]
    if steps:
        srows.append(("sum of the steps", f"{total:.2f}", "100%"))
    parts = Table(("step of gemmlib.matmul(A, B, out=C)", "host us", "share"), srows,
                  caption=f"The steps of one call, timed one by one ({where})")
    return calls, parts


def first_call_line(data: dict) -> str | None:
    """One line on the first call in a fresh process (``data["first_call"]``), or None."""
    fc = data.get("first_call")
    if not isinstance(fc, dict) or "cold_s" not in fc:
        return None
    line = (f"First call in a fresh process on {data.get('meta', {}).get('gpu', '?')}: "
            f"import {fc.get('import_s', float('nan')):.2f} s; first matmul "
            f"{fc['cold_s']:.2f} s with an empty kernel cache")
    if "warm_s" in fc:
        line += f", {fc['warm_s']:.2f} s with the kernels on disk"
    return line + "."


def _show_each(files, missing: str, show) -> int:
    """``show(name, data)`` for each (file name, data), then its figure; a note when none."""
    if not files:
        print(f"({NO_CALL_DATA}: {missing})")
        return 0
    import matplotlib.pyplot as plt

    for name, data in files:
        show(name, data)
        plt.show()
    return len(files)


def _of_gpu(files, gpu: str | None):
    """The (file name, data) of ``files`` measured on a GPU whose name contains ``gpu``
    (case-insensitive); all of them when ``gpu`` is None."""
    if gpu is None:
        return files
    return [(n, d) for n, d in files
            if gpu.lower() in str(d.get("meta", {}).get("gpu", n)).lower()]


def show_host_costs(directory=None, gpu: str | None = None) -> int:
    """Tables and a figure for every GPU's newest host-cost record (only the GPUs whose
    name contains ``gpu``, if given); returns how many."""
    from IPython.display import display

    from gemmcourse.viz import plot_host_costs

    def show(name, data):
        calls, parts = host_cost_tables(data, name)
        display(calls)
        display(parts)
        line = first_call_line(data)
        if line:
            print(line)
        plot_host_costs(data)

    return _show_each(_of_gpu(host_cost_files(directory), gpu),
                      "results/host-cost-*.json appears once gemmlib.bench.host_costs has run "
                      "on a GPU and its file is committed", show)


def call_level_files(directory=None):
    """The newest ``bench-<gpu>-<date>-call.json`` per GPU: [(file name, data)]."""
    return _newest_per_gpu(committed_json("bench-*-call.json", directory))


def _kernel_rows_elsewhere(data: dict, directory=None):
    """(file name, rows) of the newest plain benchmark of the same GPU (kernel timing)."""
    slug = data.get("meta", {}).get("gpu_slug")
    if not slug:
        return None, []
    files = [(n, d) for n, d in committed_json(f"bench-{slug}-*.json", directory)
             if not n.endswith("-call.json") and isinstance(d, dict)]
    if not files:
        return None, []
    name, d = max(files, key=lambda f: (str(f[1].get("meta", {}).get("date", "")), f[0]))
    return name, d.get("rows", [])


def call_level_records(data: dict, targets: dict, kernel_rows=None, kernel: str = "auto"):
    """One record per shape of ``kernel``'s call-timed rows: % of cuBLAS by call and (where
    a kernel-timed row of the same shape exists) by kernel, the configuration that ran,
    host microseconds of the call and of cuBLAS's call, and the target."""
    nan = float("nan")
    rows = data.get("rows", [])
    krows = list(kernel_rows or []) + [r for r in rows if r.get("timing") == "kernel"]
    kernel_pct = {(r["M"], r["N"], r["K"]): r.get("pct_of_cublas") for r in krows
                  if r.get("kernel") == kernel and r.get("timing", "kernel") == "kernel"}
    cublas_host = {(r["M"], r["N"], r["K"]): r.get("host_us", nan) for r in rows
                   if r.get("kernel") == "cublas" and r.get("timing") == "call"}
    out = []
    for r in rows:
        if r.get("kernel") != kernel or r.get("timing") != "call":
            continue
        shape = (r["M"], r["N"], r["K"])
        target = targets.get(shape)
        pct = r.get("pct_of_cublas")
        out.append(dict(shape=shape, label="x".join(map(str, shape)), call=pct,
                        kernel=kernel_pct.get(shape), target=target,
                        met=None if target is None or pct is None else pct >= target,
                        config=r.get("note", ""), host_us=r.get("host_us", nan),
                        cublas_host_us=cublas_host.get(shape, nan)))
    order = {s: i for i, s in enumerate(targets)}  # the targets' order, then the rest by size
    out.sort(key=lambda d: (order.get(d["shape"], len(order)),
                            d["shape"][0] * d["shape"][1] * d["shape"][2]))
    return out


def call_level_table(name: str, data: dict, targets: dict, directory=None):
    """(Table, records) for one call-level benchmark file."""
    kname, krows = None, []
    if not any(r.get("timing") == "kernel" and r.get("kernel") == "auto"
               for r in data.get("rows", [])):
        kname, krows = _kernel_rows_elsewhere(data, directory)
    recs = call_level_records(data, targets, krows)
    pct = lambda v: "-" if v is None else f"{v:.1f}%"  # noqa: E731
    us = lambda v: "-" if v is None or v != v else f"{v:.1f}"  # noqa: E731
    body = [(d["label"], pct(d["call"]), pct(d["target"]),
             "-" if d["met"] is None else ("met" if d["met"] else "missed"),
             pct(d["kernel"]), d["config"], us(d["host_us"]), us(d["cublas_host_us"]))
            for d in recs]
    meta = data.get("meta", {})
    cap = (f"kernel='auto' against cuBLAS, both timed as calls: {meta.get('gpu', '?')}, "
           f"{str(meta.get('date', ''))[:10]} ({name})")
    if kname:
        cap += f"; kernel-alone column from {kname}"
    header = ("M x N x K", "% of cuBLAS (call)", "target", "", "% of cuBLAS (kernel alone)",
              "configuration that ran", "host us, gemmlib", "host us, cuBLAS")
    return Table(header, body, caption=cap), recs


#: The library call's targets: % of cuBLAS, both timed as calls (fp32, TF32 off).
CALL_TARGETS = {
    (4096, 4096, 4096): 90, (8192, 8192, 8192): 90, (2048, 2048, 2048): 80,
    (1024, 1024, 1024): 70, (4095, 4097, 4093): 85, (1024, 1024, 8192): 75,
    (8192, 256, 8192): 75, (777, 1999, 3001): 65,
}


def show_call_level(targets: dict, directory=None, gpu: str | None = None, *,
                    table: bool = True, chart: bool = True) -> int:
    """A table and a chart per GPU of the newest call-level benchmark (only the GPUs whose
    name contains ``gpu``, if given; ``table``/``chart`` False leaves that one out, for a
    page that shows the chart and collapses the table); returns how many."""
    from IPython.display import display

    from gemmcourse.viz import plot_call_level

    def show(name, data):
        tab, recs = call_level_table(name, data, targets, directory)
        if table:
            display(tab)
        judged = [d for d in recs if d["met"] is not None]
        missing = [f"{'x'.join(map(str, s))}" for s in targets
                   if s not in {d["shape"] for d in recs}]
        gpu = data.get("meta", {}).get("gpu", "?")
        print(f"{gpu}: {sum(d['met'] for d in judged)} of {len(judged)} targets met"
              + (f"; not measured: {', '.join(missing)}" if missing else ""))
        if recs and chart:
            plot_call_level(recs, title=f"gemmlib.matmul (kernel='auto') vs cuBLAS, "
                            f"call timing, on {gpu}")

    return _show_each(_of_gpu(call_level_files(directory), gpu),
                      "results/bench-*-call.json appears once "
                      "`python -m gemmlib bench` has timed the calls on a GPU and its file is "
                      "committed", show)
