"""Cold compile time of the Hopper rungs, offline (no GPU): one fresh process per rung.

What a first ``gemmlib.matmul`` pays on an empty cache is ``gemmlib.runtime.compile._compile``:
numba types the kernel and every device function it calls, lowers them to LLVM IR,
NVVM turns that into PTX, and ptxas into machine code.  This script does the same
steps for sm_90a with the signature dispatch uses (``ptx.signature``) and times them:

* ``build``  importing numba, gemmlib and the rung's module, building its spec
* ``typing`` numba's type inference, of the kernel and of each device function (exclusive:
  a device function compiled while its caller is typed counts in its own passes)
* ``lower``  numba's lowering to LLVM IR (and its library set-up)
* ``other``  numba's other passes (bytecode, IR rewrites) and the glue between them
* ``nvvm``   LLVM IR -> PTX (the kernel wrapper, NVVM -O3)
* ``ptxas``  PTX -> sm_90a machine code (ptxas inside nvJitLink, as the gate runs it)
* ``to_ptx`` = typing + lower + other + nvvm;  ``total`` = build + to_ptx + ptxas

Times are CPU seconds of the compiling process (``wall`` is the wall-clock total, which a
busy host inflates).  It also checks the PTX: wgmma instructions, local-memory loads and
stores, the rung's ``ptx_must`` / ``ptx_must_not``, and ptxas's registers and spills.  The
kernel is compiled with its ``launch_bounds`` as dispatch compiles it (``.maxntid`` in the
PTX), which the compile gate leaves out: ptxas's register cap, and so its spills, can differ
from the gate's (``problems`` applies the rung's ``max_spill_bytes`` to these).  The JSON
record also has the numba seconds per pass and per function (``by_function``).

    python scripts/compile_time.py                  # every rung in RUNGS, a table
    python scripts/compile_time.py wgmma_ws:bf16    # one (module[:precision])
    python scripts/compile_time.py wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2   # a build
    python scripts/compile_time.py --json out.json
    python scripts/compile_time.py --profile wgmma_ws   # cProfile of one compile (top 40)

Timings on a slow host CPU are longer than on a GPU server's; compare runs on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: module[:precision] of each Hopper rung measured by default
RUNGS = ("wgmma_ws", "wgmma_ws:bf16", "wgmma_split_k", "wgmma_tf32", "wgmma_fp8",
         "wgmma_tma", "wgmma_async", "wgmma_cluster", "wgmma_pingpong", "wgmma_store",
         "wgmma_store:fp16:OUT=fp16:STAGES=4:PIECES=2")


#: the clock of every phase: this process's CPU seconds (the host may be busy with other
#: work; numba, NVVM and ptxas all run in this process, on one thread)
CLOCK = time.process_time


def measure(rung: str) -> dict:
    """Compile ``rung`` in this process (must be fresh for a cold number)."""
    w0 = time.perf_counter()
    t0 = CLOCK()
    import importlib

    from gemmlib import ptx as P
    from gemmlib.kernels import build_params
    mod_name, *rest = rung.split(":")
    mod = importlib.import_module(f"gemmlib.kernels.{mod_name}")
    # module[:precision[:KEY=VALUE...]]: another build of the rung, as sanitize_target takes it
    spec = mod.build(rest[0], **build_params(rest[1:])) if rest else mod.SPEC
    t_build = CLOCK() - t0

    from numba import cuda
    from numba.cuda import compiler

    cc = (9, 0)
    opts = spec.kernel.targetoptions
    real = compiler.compile_cuda
    outer = {}

    def timed(*a, **k):   # the kernel's compile_cuda (device functions nest inside it)
        if outer:
            return real(*a, **k)
        outer["t"] = CLOCK()
        try:
            return real(*a, **k)
        finally:
            outer["dt"] = CLOCK() - outer["t"]

    compiler.compile_cuda = timed
    passes = _pass_clock()
    try:
        with P.offline_device(cc):   # as dispatch: kernel.compile(sig), with its options
            t1 = CLOCK()
            text, _ = cuda.compile_ptx(spec.kernel.py_func, P.signature(spec), cc=cc,
                                       launch_bounds=opts.get("launch_bounds"),
                                       **{k: v for k, v in opts.items()
                                          if k in ("fastmath", "lineinfo", "debug", "opt")})
            t3 = CLOCK()
    finally:
        compiler.compile_cuda = real
        passes.stop()
    t2 = t1 + outer["dt"]
    arch = P.arch_of(spec, cc)
    text = re.sub(r"\.target sm_\d+\b", f".target {arch}", text)
    res = P.resources(text, cc, opts.get("max_registers"), arch=arch)
    t4 = CLOCK()

    typing = sum(v for k, v in passes.exclusive.items() if "type_inference" in k)
    lower = sum(v for k, v in passes.exclusive.items() if "lowering" in k or "backend" in k
                or "library" in k)
    return {
        "rung": rung, "kernel": spec.name,
        "build": round(t_build, 2), "typing": round(typing, 2),
        "lower": round(lower, 2), "other": round(t2 - t1 - typing - lower, 2),
        "nvvm": round(t3 - t2, 2), "functions": passes.functions,
        "passes": {k: round(v, 2) for k, v in sorted(passes.exclusive.items(),
                                                     key=lambda kv: -kv[1])[:8]},
        "by_function": {k: round(v, 2) for k, v in sorted(passes.by_function.items(),
                                                          key=lambda kv: -kv[1])},
        "ptxas": round(t4 - t3, 2), "to_ptx": round(t3 - t1, 2),
        "total": round(t_build + t4 - t1, 2), "wall": round(time.perf_counter() - w0, 2),
        "wgmma": len(re.findall(r"wgmma\.mma_async", text)),
        "local": len(re.findall(r"\b(?:ld|st)\.local", text)),
        "ptx_lines": text.count("\n"),
        "problems": P.problems(spec, text, res),
        **res,
    }


class _pass_clock:
    """Exclusive seconds per numba compiler pass, summed over the kernel and every device
    function compiled for it (a device function compiles inside its caller's type
    inference: that time is counted once, as the callee's own passes)."""

    def __init__(self):
        from numba.cuda.core import compiler_machinery as cm

        self.cm, self.real = cm, cm.PassManager._runPass
        self.exclusive, self.stack, self.functions, self.by_function = {}, [], 0, {}
        clock = self

        def run(pm, index, pss, state):
            name = pss.name()
            if name.endswith("type_inference"):
                clock.functions += 1
            clock.stack.append(0.0)
            t = CLOCK()
            try:
                return clock.real(pm, index, pss, state)
            finally:
                dt = CLOCK() - t
                nested = clock.stack.pop()
                clock.exclusive[name] = clock.exclusive.get(name, 0.0) + dt - nested
                fn = state.func_id.func_qualname.split(".")[-1]
                clock.by_function[fn] = clock.by_function.get(fn, 0.0) + dt - nested
                if clock.stack:
                    clock.stack[-1] += dt

        cm.PassManager._runPass = run

    def stop(self):
        self.cm.PassManager._runPass = self.real


def profile(rung: str, top: int = 40) -> None:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    rec = measure(rung)
    pr.disable()
    print(json.dumps(rec))
    st = pstats.Stats(pr).sort_stats("cumulative")
    st.print_stats(top)
    st.sort_stats("tottime").print_stats(25)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rungs", nargs="*",
                   help="module[:precision[:KEY=VALUE...]] (default: %s)" % " ".join(RUNGS))
    p.add_argument("--json", help="write the records to this file")
    p.add_argument("--profile", metavar="RUNG", help="cProfile one compile instead")
    p.add_argument("--one", metavar="RUNG", help=argparse.SUPPRESS)   # the child process
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(measure(a.one)))
        return 0
    if a.profile:
        profile(a.profile)
        return 0
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    records = []
    cols = ("build", "typing", "lower", "other", "nvvm", "to_ptx", "ptxas", "total", "wall")
    print(f"{'rung':<16}" + "".join(f"{c:>8}" for c in cols)
          + "  wgmma local regs spill problems")
    for rung in a.rungs or RUNGS:
        out = subprocess.run([sys.executable, __file__, "--one", rung], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            print(f"{rung:<16} failed:\n{out.stderr[-2000:]}")
            records.append({"rung": rung, "error": out.stderr[-2000:]})
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        records.append(r)
        print(f"{rung:<16}" + "".join(f"{r[c]:8.2f}" for c in cols)
              + f"  {r['wgmma']:5d} {r['local']:5d} {r['registers']!s:>4} "
                f"{r['spill_stores']!s:>5} {'; '.join(r['problems']) or 'ok'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1))
    return 1 if any(r.get("error") or r.get("problems") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
