"""The compile gate: compile every kernel to PTX for several GPUs, with no GPU.

The simulator runs kernels as Python and accepts code the real compiler
rejects (a local array whose shape is an expression, say).  numba-cuda with
its CUDA 13 extra compiles to PTX on any machine, so every registered kernel
is compiled here for sm_75 (T4), sm_80 (A100) and sm_90 (H100/H200), and the
PTX is checked for what the rung claims: ``spec.ptx_must`` patterns present
(e.g. ``ld.global.v4.f32`` for 16-byte loads) and ``spec.ptx_must_not``
absent (by default any ``ld.local``/``st.local``: register arrays placed in
local memory).  The PTX is then assembled by ptxas (through nvJitLink, still
offline) to report registers and spills; a rung may spill no more than its
``spec.max_spill_bytes`` (0 unless it says why).

Run it as ``python -m gemmlib.ptx`` (the simulator must be off).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import re
import sys
import time
import types

from gemmlib import backend
from gemmlib.kernels import LADDER, get as get_kernel

TARGETS = ((7, 5), (8, 0), (9, 0))


def signature(spec):
    from numba import types

    return (tuple(getattr(types, d)[:, ::1] for d in spec.array_dtypes)
            + tuple(getattr(types, s) for s in spec.scalar_args))


def arch_of(spec, cc) -> str:
    """The ptxas target: Hopper rungs (min_cc 9.0) use the arch-specific sm_90a, which
    numba-cuda itself targets on an H100/H200 (offline it writes plain sm_90)."""
    return f"sm_{cc[0]}{cc[1]}" + ("a" if tuple(spec.min_cc) >= (9, 0) else "")


def compile_ptx(spec, cc=(9, 0)) -> str:
    """PTX of ``spec.kernel`` for compute capability ``cc`` (needs the real compiler)."""
    if backend.SIMULATOR:
        raise RuntimeError("compile_ptx needs numba-cuda's compiler: unset NUMBA_ENABLE_CUDASIM")
    from numba import cuda

    opts = {k: v for k, v in spec.kernel.targetoptions.items()
            if k in ("fastmath", "lineinfo", "debug", "opt")}
    with offline_device(cc):
        ptx, _ = cuda.compile_ptx(spec.kernel.py_func, signature(spec), cc=cc, **opts)
    arch = arch_of(spec, cc)
    if arch.endswith("a"):
        ptx = re.sub(r"\.target sm_\d+\b", f".target {arch}", ptx)
    return ptx


def compile_prep_ptx(spec, cc=(9, 0)) -> str:
    """PTX of ``spec.b_prep`` (the pre-pass that transposes B), "" for rungs without one."""
    if spec.b_prep is None:
        return ""
    from numba import cuda, types

    t = getattr(types, spec.kernel_dtypes[1])[:, ::1]
    with offline_device(cc):
        ptx, _ = cuda.compile_ptx(spec.b_prep.py_func, (t, t), cc=cc)
    return ptx


@contextlib.contextmanager
def offline_device(cc):
    """Let device functions compile with no GPU.

    compile_ptx itself needs no driver, but a ``cuda.jit(device=True)``
    function called from the kernel asks the driver for the current device's
    compute capability.  Answer with the target's, for the compile only.
    """
    from numba.cuda import dispatcher

    if backend.gpu_present():
        yield
        return
    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=tuple(cc))
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def link_options(arch: str, max_registers: int | None = None, verbose: bool = False) -> list[str]:
    """nvJitLink's options for machine code of ``arch`` (e.g. "sm_75", "sm_90a")."""
    opts = [f"-arch={arch}"]
    if max_registers:  # the kernel's cuda.jit(max_registers=...) cap, as the driver applies it
        opts.append(f"-maxrregcount={max_registers}")
    if verbose:
        opts.append("-verbose")
    return opts


def _link(ptx: str, opts: list[str], cubin: bool) -> tuple[bytes, str]:
    """(cubin or b"", info log) of ``ptx`` linked by nvJitLink with ``opts``."""
    from cuda.bindings import nvjitlink

    h = nvjitlink.create(len(opts), opts)
    try:
        data = ptx.encode()
        try:
            nvjitlink.add_data(h, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
            nvjitlink.complete(h)
        except nvjitlink.nvJitLinkError as e:
            log = bytearray(nvjitlink.get_error_log_size(h))
            nvjitlink.get_error_log(h, log)
            ptx_isa = re.search(r"^\s*\.version\s+(\S+)", ptx, re.M)
            raise RuntimeError(
                f"nvJitLink {'.'.join(map(str, nvjitlink.version()))} could not assemble PTX "
                f"ISA {ptx_isa.group(1) if ptx_isa else '?'} ({' '.join(opts)}): {e}\n"
                f"{log.decode(errors='replace').strip()}\n"
                "nvJitLink must be at least as new as the NVVM that wrote the PTX (pip: "
                "nvidia-nvjitlink-cu12 / nvidia-nvjitlink at NVVM's CUDA version or newer)") from e
        out = b""
        if cubin:
            buf = bytearray(nvjitlink.get_linked_cubin_size(h))
            nvjitlink.get_linked_cubin(h, buf)
            out = bytes(buf)
        log = bytearray(nvjitlink.get_info_log_size(h))
        nvjitlink.get_info_log(h, log)
    finally:
        nvjitlink.destroy(h)
    return out, log.decode(errors="replace")


def assemble(ptx: str, arch: str, max_registers: int | None = None) -> bytes:
    """Machine code (a cubin of SASS for ``arch``) from ``ptx``, assembled here by nvJitLink.

    What gemmlib loads is this, never PTX: the driver JIT-compiles PTX only of an ISA version
    it knows, so PTX from a newer compiler fails on an older driver (a T4 on Colab runs a
    CUDA 12.4-class driver; pip's CUDA 12 compiler is 12.9). Machine code linked here runs on
    any driver of the same CUDA major version (CUDA's minor-version compatibility).
    """
    return _link(ptx, link_options(arch, max_registers), cubin=True)[0]


def resources(ptx: str, cc=(9, 0), max_registers: int | None = None,
              arch: str | None = None) -> dict:
    """Registers, spills and stack of the PTX once assembled to machine code.

    PTX alone cannot show spills: ptxas decides register allocation.  ptxas
    ships inside nvJitLink (a wheel of numba-cuda's CUDA extra), so this runs
    with no GPU and gives the same counts the driver reports on the device.
    """
    opts = link_options(arch or f"sm_{cc[0]}{cc[1]}", max_registers, verbose=True)
    text = _link(ptx, opts, cubin=False)[1]

    def num(pattern):
        m = re.search(pattern, text)
        return int(m.group(1)) if m else None

    serialized = re.search(r"wgmma\.mma_async instructions are serialized due to ([^.']+)", text)
    return {"registers": num(r"[Uu]sed (\d+) registers"),
            "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"),
            "stack_bytes": num(r"(\d+) bytes stack frame"),
            "wgmma_serialized": serialized.group(1).strip() if serialized else None}


#: PTX that may read or write global memory: loads, stores and atomics other than to
#: parameters, shared, local or constant memory (numba's are generic), TMA, tensor maps
_GLOBAL_ACCESS = r"\b(ld|st|atom|red)(?!\.(param|shared|local|const))\.|cp\.async\.bulk|tensormap"


def problems(spec, ptx: str, res: dict | None = None) -> list[str]:
    """What the compiled code fails to show (empty list: it shows what the rung claims)."""
    out = [f"missing /{p}/" for p in spec.ptx_must if not re.search(p, ptx)]
    out += [f"forbidden /{p}/ found: {re.search(p, ptx).group(0)!r}"
            for p in spec.ptx_must_not if re.search(p, ptx)]
    if spec.early_launch:   # launched before the previous kernel ends: wait first
        entry = ptx[ptx.find(".entry"):]
        first = re.search(_GLOBAL_ACCESS, entry)
        wait = entry.find("griddepcontrol.wait")
        if wait < 0 or (first is not None and first.start() < wait):
            out.append("launched early, but touches global memory before griddepcontrol.wait")
    if (res or {}).get("wgmma_serialized"):   # each wgmma waits for the one before
        out.append(f"ptxas serialized the wgmma instructions: {res['wgmma_serialized']} "
                   "(a 64-bit division by a run-time value is such a call: "
                   "gemmlib.intrinsics.index)")
    spills = (res or {}).get("spill_stores") or 0
    if spills > spec.max_spill_bytes:
        out.append(f"{spills} bytes of register spills (allowed: {spec.max_spill_bytes})")
    return out


def for_target(spec, cc):
    """The form of ``spec`` a GPU of compute capability ``cc`` runs: a rung whose params
    name an ``arch`` (the tensor-core rungs with an sm_75 form) is rebuilt for ``cc``."""
    if "arch" not in spec.params:
        return spec
    from gemmlib.intrinsics.mma import arch_for

    arch = arch_for(spec.precision, cc)
    if arch == spec.params["arch"]:
        return spec
    return importlib.import_module(spec.module).build(spec.precision, arch=arch)


def gate(names=None, targets=TARGETS) -> list[dict]:
    """Compile each kernel for each target; one record per (kernel, target)."""
    records = []
    for name in names or LADDER:
        for cc in targets:
            spec = for_target(get_kernel(name), cc)
            t0 = time.perf_counter()
            # "rung": the registered name (a rung's spec name may differ by mode and target)
            rec = {"rung": name, "kernel": spec.name, "cc": f"sm_{cc[0]}{cc[1]}"}
            if tuple(cc) < tuple(spec.min_cc):
                rec.update(skipped=f"needs sm_{spec.min_cc[0]}{spec.min_cc[1]}+", problems=[])
            else:
                try:
                    ptx = compile_ptx(spec, cc)
                    compile_prep_ptx(spec, cc)   # its pre-pass must compile too
                    rec.update(resources(ptx, cc, spec.kernel.targetoptions.get("max_registers"),
                                         arch=arch_of(spec, cc)))
                    rec["problems"] = problems(spec, ptx, rec)
                    rec["ptx_lines"] = ptx.count("\n")
                except Exception as e:  # a compile error is the finding
                    rec["problems"] = [f"compile error: {type(e).__name__}: {e}".splitlines()[0]]
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            records.append(rec)
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gemmlib.ptx", description=__doc__.split("\n\n")[0])
    p.add_argument("kernels", nargs="*", help="kernel names (default: all)")
    p.add_argument("--cc", nargs="*", default=[f"{a}{b}" for a, b in TARGETS],
                   help="targets as 75 80 90 (default: %(default)s)")
    p.add_argument("--json", help="write the records to this file")
    args = p.parse_args(argv)
    targets = [(int(c[:-1]), int(c[-1])) for c in args.cc]
    records = gate(args.kernels or None, targets)
    for r in records:
        status = r.get("skipped") or ("ok" if not r["problems"] else "; ".join(r["problems"]))
        regs = (f"{r['registers']:>3} regs, {r['spill_stores']} B spilled"
                if r.get("registers") is not None else "")
        print(f"{r['kernel']:>16} {r['cc']}  {r['seconds']:5.1f}s  {regs:<24} {status}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 1 if any(r["problems"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
