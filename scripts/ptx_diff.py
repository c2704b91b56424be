"""Dump the sm_90a PTX of the warp-specialised rungs' builds, and compare two dumps.

A refactor of kernel code that should not change what runs can be checked with no GPU:
the PTX of every build before and after must be the same, once the names numba mangles
from Python's (module paths, closure ids) are normalised.  Where it is not the same, the
comparison says whether only register numbers and labels moved (the same instructions,
as a multiset, with registers and labels renamed) or instructions differ, and shows them.
It also compares the machine code ptxas makes of each (``cuobjdump -sass``, where a
cuobjdump is found: ``$CUOBJDUMP`` or on the PATH): the same SASS, encodings and
scheduling bits included, is the same program whatever the PTX's order.

    NUMBA_ENABLE_CUDASIM=0 python scripts/ptx_diff.py dump /tmp/ptx-before [LABEL ...]
    NUMBA_ENABLE_CUDASIM=0 python scripts/ptx_diff.py dump /tmp/ptx-after
    python scripts/ptx_diff.py compare /tmp/ptx-before /tmp/ptx-after

``dump`` writes ``LABEL.ptx``, ``LABEL.cubin`` (sm_90a) and ``LABEL.json`` (ptxas's
registers and spills, as the compile gate reports them) per build of :data:`BUILDS`.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: (label, rung, build parameters): the defaults and the variants the runtime builds
BUILDS = (
    ("ws", "wgmma_ws", {}),
    ("ws_bf16_nk", "wgmma_ws", {"precision": "bf16", "B_LAYOUT": "NK"}),
    ("ws_o16", "wgmma_ws", {"OUT": "bf16", "precision": "bf16"}),
    ("ws_bias_km", "wgmma_ws", {"BIAS": True, "A_LAYOUT": "KM"}),
    ("ws_bn128", "wgmma_ws", {"BN": 128}),
    ("ws_regsnone", "wgmma_ws", {"REGS": None}),
    ("tf32", "wgmma_tf32", {}),
    ("fp8", "wgmma_fp8", {}),
    ("store", "wgmma_store", {}),
    ("store_s4p2_o16", "wgmma_store", {"STAGES": 4, "PIECES": 2, "OUT": "fp16"}),
    ("store_bn64_s8_o16", "wgmma_store", {"BN": 64, "STAGES": 8, "OUT": "fp16"}),
    ("store_bn128_s4_o16_nk_bias", "wgmma_store",
     {"BN": 128, "STAGES": 4, "OUT": "fp16", "B_LAYOUT": "NK", "BIAS": True}),
    ("store_km", "wgmma_store", {"A_LAYOUT": "KM"}),
    ("pingpong", "wgmma_pingpong", {}),
    ("pingpong_unordered", "wgmma_pingpong", {"ORDERED": False}),
    ("pingpong_o16_nk_bias", "wgmma_pingpong", {"OUT": "fp16", "B_LAYOUT": "NK", "BIAS": True}),
    ("pingpong_64x128_s4", "wgmma_pingpong", {"BM": 64, "STAGES": 4}),
    ("cluster", "wgmma_cluster", {}),
    ("cluster_c1", "wgmma_cluster", {"CM": 1}),
    ("cluster_all", "wgmma_cluster", {"ARRIVE": "all"}),
    ("cluster_local", "wgmma_cluster", {"ARRIVE": "local"}),
    ("cluster_unicast", "wgmma_cluster", {"CM": 1, "MULTICAST": False}),
    ("cluster_o16_nk_bias", "wgmma_cluster", {"OUT": "fp16", "B_LAYOUT": "NK", "BIAS": True}),
    ("split_k", "wgmma_split_k", {}),
    ("split_k_bm64", "wgmma_split_k", {"BM": 64}),
    ("split_k_stream", "wgmma_split_k", {"STREAM": True}),
    ("split_k_o16_nk_bias_km", "wgmma_split_k",
     {"OUT": "fp16", "B_LAYOUT": "NK", "BIAS": True, "A_LAYOUT": "KM"}),
    ("swap", "wgmma_swap", {}),
    ("swap_bn128_kt128", "wgmma_swap", {"BN": 128, "KT": 128}),
    ("swap_kn_o16_bias", "wgmma_swap", {"B_LAYOUT": "KN", "OUT": "fp16", "BIAS": True}),
    ("swap_bm128", "wgmma_swap", {"BM": 128, "BN": 64}),
)


def dump(out: Path, labels) -> None:
    from gemmlib import ptx
    from gemmlib.runtime import select as S

    out.mkdir(parents=True, exist_ok=True)
    for label, rung, params in BUILDS:
        if labels and label not in labels:
            continue
        spec = S.build(rung, params)
        code = ptx.compile_ptx(spec)
        res = ptx.resources(code, arch=ptx.arch_of(spec, (9, 0)))
        (out / f"{label}.ptx").write_text(code)
        (out / f"{label}.cubin").write_bytes(ptx.assemble(code, ptx.arch_of(spec, (9, 0))))
        (out / f"{label}.json").write_text(json.dumps(
            dict(name=spec.name, problems=ptx.problems(spec, code, res), **res), indent=1))
        print(f"{label:28} {spec.name:40} {res['registers']:>4} regs "
              f"{res['spill_stores']} B spilled", flush=True)


#: a mangled Python name inside a PTX symbol: _ZN<len><name>... (module paths, locals, ids)
MANGLED = re.compile(r"_ZN[\w$]+")
#: numba's declaration of each (device) function's environment: one line per function,
#: never read by the code; a function split in two adds one
ENV_DECL = re.compile(r"^\.common \.global \.align 8 \.u64 _ZN08NumbaEnv.*;$", re.M)
SMEM = re.compile(r"_cudapy_smem_\d+")
REG = re.compile(r"%(r|rd|f|fd|p|rs|h|hh|b|bd)(\d+|<\d+>)")
LABEL = re.compile(r"\$L__\w+")


def normalise_names(ptx: str) -> str:
    """The PTX with each mangled symbol replaced by its order of first appearance, and the
    header comments (compiler versions) dropped."""
    seen: dict = {}

    def sym(m):
        return seen.setdefault(m.group(0), f"SYM{len(seen)}")

    lines = [ln for ln in ENV_DECL.sub("", ptx).splitlines() if not ln.startswith("//")]
    return SMEM.sub(sym, MANGLED.sub(sym, "\n".join(lines)))


def shape(ptx: str) -> str:
    """Registers and labels renamed away: what is left of each instruction is its shape."""
    return LABEL.sub("$L", REG.sub(lambda m: "%" + m.group(1), ptx))


def instructions(ptx: str) -> list[str]:
    return [ln.strip() for ln in ptx.splitlines() if ln.strip() and not ln.strip().startswith(
        ("//", ".loc", ".file"))]


def sass(cubin: Path) -> str | None:
    """The machine code of ``cubin`` as cuobjdump prints it, mangled names numbered; None
    without a cuobjdump or a cubin."""
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool or not cubin.exists():
        return None
    text = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    seen: dict = {}
    return MANGLED.sub(lambda m: seen.setdefault(m.group(0), f"SYM{len(seen)}"), text)


SASS_REG = re.compile(r"\bU?[RP]\d+\b")
SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*/\* 0x[0-9a-f]+ \*/\s*$")


SASS_ADDR = re.compile(r"0x[0-9a-f]+")


#: the same integer operation, which ptxas issues on the IMAD or the ALU pipe as it balances
#: them: an add (``IMAD.IADD d, a, 0x1, b`` is d = a * 1 + b) and a move
ALIASES = ((re.compile(r"^IMAD\.IADD (\S+), (\S+), 0x1, (\S+) ;$"), r"IADD3 \1, \2, \3, RZ ;"),
           (re.compile(r"^IMAD\.MOV\.U32 (\S+), RZ, RZ, (\S+) ;$"), r"MOV \1, \2 ;"))


def alias(instruction: str) -> str:
    for pattern, canonical in ALIASES:
        instruction = pattern.sub(canonical, instruction)
    return instruction


def sass_diff(a: str, b: str) -> str:
    """How the machine code ``b`` differs from ``a``: only in the registers of some
    instructions (each at the same address), or the same instructions (registers and
    addresses aside) in another order, or more."""
    la = [m.groups() for m in map(SASS_LINE.match, a.splitlines()) if m]
    lb = [m.groups() for m in map(SASS_LINE.match, b.splitlines()) if m]
    if [p for p, _ in la] == [p for p, _ in lb] and all(
            SASS_REG.sub("R", ia) == SASS_REG.sub("R", ib) for (_, ia), (_, ib) in zip(la, lb)):
        changed = sum(ia != ib for (_, ia), (_, ib) in zip(la, lb))
        return (f"SASS the same instructions at the same addresses, {changed} of {len(la)} "
                "with other register numbers")

    def shapes(lines):
        return [SASS_ADDR.sub("A", SASS_REG.sub("R", alias(i))) for _, i in lines]

    sa, sb = shapes(la), shapes(lb)
    if collections.Counter(sa) == collections.Counter(sb):
        sm = difflib.SequenceMatcher(None, sa, sb, autojunk=False)
        moved = sum(i2 - i1 for tag, i1, i2, _, _ in sm.get_opcodes() if tag != "equal")
        return (f"SASS the same instruction multiset ({len(sa)}; registers, addresses and the "
                f"IMAD/ALU forms of an add or a move aside), {moved} in another place")
    return "SASS DIFFERS"


def compare(before: Path, after: Path, show: int) -> int:
    bad = 0
    for p in sorted(before.glob("*.ptx")):
        q = after / p.name
        label = p.stem
        if not q.exists():
            print(f"{label:28} missing after")
            bad += 1
            continue
        a, b = p.read_text(), q.read_text()
        ra = json.loads(p.with_suffix(".json").read_text())
        rb = json.loads(q.with_suffix(".json").read_text())
        regs = f"regs {ra['registers']}->{rb['registers']}, spills {ra['spill_stores']}->" \
               f"{rb['spill_stores']}"
        worse = (rb["registers"] > ra["registers"]
                 or (rb["spill_stores"] or 0) > (ra["spill_stores"] or 0))
        envs = f"env decls {len(ENV_DECL.findall(a))}->{len(ENV_DECL.findall(b))}"
        if a == b:
            verdict = "identical"
        elif normalise_names(a) == normalise_names(b):
            verdict = f"identical but for mangled names ({envs})"
        else:
            na, nb = normalise_names(a), normalise_names(b)
            ia, ib = instructions(shape(na)), instructions(shape(nb))
            ca, cb = collections.Counter(ia), collections.Counter(ib)
            if ca == cb:
                sm = difflib.SequenceMatcher(None, ia, ib, autojunk=False)
                moved = sum(i2 - i1 for tag, i1, i2, _, _ in sm.get_opcodes() if tag != "equal")
                verdict = (f"same instruction multiset ({len(ia)} lines, {moved} in another "
                           f"order), registers/labels differ ({envs})")
                if 0 < moved <= 8:
                    verdict += "; moved: " + ", ".join(
                        " ".join(ib[j].split()) for tag, _, _, j1, j2 in sm.get_opcodes()
                        if tag in ("insert", "replace") for j in range(j1, j2))
            else:
                verdict = (f"DIFFERENT: -{sum((ca - cb).values())} +{sum((cb - ca).values())} "
                           f"instruction shapes")
                bad += 1
                if show:
                    for ln in list(difflib.unified_diff(ia, ib,
                                                        lineterm="", n=1))[:show]:
                        print("    " + ln)
        sa, sb = sass(p.with_suffix(".cubin")), sass(q.with_suffix(".cubin"))
        if sa is not None and sb is not None:
            verdict += "; SASS identical" if sa == sb else "; " + sass_diff(sa, sb)
        if worse:
            bad += 1
            verdict += "; RESOURCES WORSE"
        print(f"{label:28} {verdict}; {regs}")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir", type=Path)
    d.add_argument("labels", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--show", type=int, default=40, help="diff lines shown per build")
    args = p.parse_args(argv)
    if args.cmd == "dump":
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") != "0":
            sys.exit("dump needs the real compiler: NUMBA_ENABLE_CUDASIM=0")
        dump(args.dir, set(args.labels))
        return 0
    return compare(args.before, args.after, args.show)


if __name__ == "__main__":
    sys.exit(main())
