"""compute-sanitizer over every registered kernel: memcheck, racecheck, synccheck, initcheck.

    python3 scripts/sanitize.py [--tools memcheck,racecheck,synccheck,initcheck]
                                [--kernels all|hopper|name,name:precision] [--shapes ...]
                                [--jobs 8] [--out DIR] [--timeout 300] [--deadline S]
                                [--warm]
    python3 scripts/sanitize.py --selftest      # the report parser, no GPU needed

``--kernels hopper``: every Hopper rung in each precision (wgmma_async, wgmma_tma,
wgmma_ws, wgmma_split_k and later sm_90 rungs in fp16 and bf16, wgmma_tf32,
wgmma_fp8 in e4m3 and e5m2 and its fp32-output / row-major-B form;
``sanitize_target.hopper()``).  Kernel
names and shape syntax are sanitize_target.py's (``rung:precision``; a shape
``300x520x528@4/3`` launches persistent rungs with at most 4 blocks and
split-K rungs with 3 slices).  When every kernel is a Hopper rung the shapes
default to ``sanitize_target.HOPPER_SHAPES`` (adding that one).  ``--warm``
first runs every kernel once without a sanitizer, in parallel (compiles into
the kernel cache; the results are checked too); ``--deadline`` bounds the
whole run: a run not started by then is reported as not run, and a started
one gets at most the time left.  scripts/sanitize_hopper.sh is the GPU
machine's driver for the Hopper list.

One process per (tool, kernel), several at once (``--jobs``), each running
``scripts/sanitize_target.py`` under

    compute-sanitizer --tool T --report-api-errors no --error-exitcode 1 ...

on each shape: 67x45x37 (nothing a multiple of 4: the scalar edge paths) and
``tile+`` (one past a block tile in M, N and K, with N and K multiples of 4:
the float4 paths and a second k-tile).  ``--report-api-errors no`` because
the CUDA Python stack probes driver entry points that do not exist, which
memcheck would otherwise report as errors for any kernel.  Where this
compute-sanitizer has them (its ``--help`` lists them), memcheck also gets
``--padding`` (a guard zone after every allocation: sanitize_target.py makes
each array its own cudaMalloc, so an overrun into the next array is caught),
every tool ``--launch-timeout 120`` (the default 10 s to connect to the
target can pass while a dozen targets import numba and CuPy at once),
memcheck and synccheck ``--check-warpgroup-mma yes`` (and memcheck
``--check-bulk-copy yes``: the wgmma and cp.async.bulk checks, on by
default, spelled out), racecheck and synccheck ``--num-cuda-barriers`` (the
mbarriers tracked per block: the tools count them from compiler information,
which may undercount, and then warn that results might be incorrect -- that
warning counts as an error here).

Each report is parsed (error blocks, warnings and the tool's summary line),
a table is printed, logs and ``sanitize.json`` go to ``--out`` (default
``$OUT/sanitize`` or ``./sanitize-logs``).  Exit status: 0 when every run is
clean and every result right, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
PREFIX = "========= "
#: Lines after the prefix that are banners or summaries, not findings.
NOT_FINDINGS = re.compile(
    r"^(COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|"
    r"Target application returned|This tool is|Note:|No .* found|$)")
WARNING_HEAD = re.compile(r"^(Warning|WARN)\b", re.I)
#: warnings that say the tool's own results cannot be trusted: errors here
UNTRUSTED = re.compile(r"Detected overflow of tracked cuda::barrier|didn't track the launch|"
                       r"Errors might go undetected|Results might be incorrect", re.I)


@dataclass
class Parsed:
    errors: int = 0
    warnings: int = 0
    summary_errors: int | None = None  # what the tool's own summary line says
    heads: list[str] = field(default_factory=list)


def parse(text: str) -> Parsed:
    """Count findings in a compute-sanitizer report.

    A finding starts on a line ``========= X`` where X is not indented (its
    details follow, indented); racecheck's warnings start with ``Warning``.
    The tool's summary (``ERROR SUMMARY: n errors`` or ``RACECHECK SUMMARY:
    h hazards displayed (e errors, w warnings)``) is parsed too; the larger
    error count wins, so a format this parser does not know still fails.
    """
    p = Parsed()
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        body = line[len(PREFIX):]
        if body.startswith(" ") or NOT_FINDINGS.match(body):
            m = re.match(r"ERROR SUMMARY: (\d+) error", body)
            if m:
                p.summary_errors = max(p.summary_errors or 0, int(m.group(1)))
            m = re.match(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, "
                         r"(\d+) warnings?\)", body)
            if m:
                p.summary_errors = max(p.summary_errors or 0, int(m.group(1)))
            continue
        if WARNING_HEAD.match(body) and not UNTRUSTED.search(body):
            p.warnings += 1
        else:
            p.errors += 1
        if len(p.heads) < 5:
            p.heads.append(body.strip())
    if p.summary_errors is not None:
        p.errors = max(p.errors, p.summary_errors)
    return p


@dataclass
class Run:
    tool: str
    kernel: str
    returncode: int
    seconds: float
    errors: int
    warnings: int
    results: list[str]
    wrong: int
    heads: list[str]
    log: str

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and self.errors == 0 and self.wrong == 0 and bool(self.results)


#: returncode of a run the deadline left no time for
NOT_RUN = -9


def sanitizer_help(sanitizer: str) -> str:
    """``compute-sanitizer --help`` (and ``--version``): which options this one has."""
    out = []
    for flag in ("--version", "--help"):
        try:
            cp = subprocess.run([sanitizer, flag], capture_output=True, text=True, timeout=60)
            out.append(cp.stdout + cp.stderr)
        except (OSError, subprocess.SubprocessError):
            out.append("")
    return "\n".join(out)


def version_of(help_text: str) -> str:
    m = re.search(r"Version\s+([\w.]+)", help_text) or re.search(r"(20\d\d\.\d+\.\d+)", help_text)
    return m.group(1) if m else "unknown"


def tool_args(tool: str, help_text: str, padding: int = 1 << 16, barriers: int = 32) -> list[str]:
    """Options for ``tool`` beyond the common ones, each only if ``help_text`` lists it."""
    has = lambda opt: re.search(rf"(^|\s){re.escape(opt)}\b", help_text, re.M)  # noqa: E731
    args = []
    if has("--launch-timeout"):   # the target's imports take a while when many start at once
        args += ["--launch-timeout", "120"]
    if tool == "racecheck":
        args += ["--racecheck-report", "all"]
    if tool == "memcheck" and padding and has("--padding"):
        args += ["--padding", str(padding)]
    if tool == "memcheck" and has("--check-bulk-copy"):
        args += ["--check-bulk-copy", "yes"]
    if tool in ("memcheck", "synccheck") and has("--check-warpgroup-mma"):
        args += ["--check-warpgroup-mma", "yes"]
    if tool in ("racecheck", "synccheck") and barriers and has("--num-cuda-barriers"):
        args += ["--num-cuda-barriers", str(barriers)]
    return args


def _env():
    # SANITIZE_SIM=1 with a fake --sanitizer: a dry run of this script in the simulator
    return dict(os.environ, NUMBA_ENABLE_CUDASIM=os.environ.get("SANITIZE_SIM", "0"),
                PYTHONUNBUFFERED="1",
                PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def _run(cmd, timeout):
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(),
                            cwd=ROOT)
        return cp.stdout + cp.stderr, cp.returncode
    except subprocess.TimeoutExpired as e:
        text = e.stdout or ""
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        return text + f"\n[sanitize.py] TIMEOUT after {timeout:.0f} s\n", 124


def _safe(name: str) -> str:
    """A kernel name as part of a file name: letters, digits, '.', '_', '-' (':' -> '.')."""
    return re.sub(r"[^\w.-]", "_", name.replace(":", "."))


def run_one(sanitizer, python, tool, kernel, shapes, out: Path, timeout, extra=(),
            deadline=None) -> Run:
    """``tool`` over sanitize_target.py on ``kernel``; ``tool=None``: without a sanitizer."""
    target = [python, str(ROOT / "scripts" / "sanitize_target.py"), kernel, shapes]
    cmd = target if tool is None else (
        [sanitizer, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "1",
         "--print-limit", "50", *extra] + target)
    name = tool or "warm"
    if deadline is not None:
        left = deadline - time.time()
        if left < 10:
            return Run(name, kernel, NOT_RUN, 0.0, 0, 0, [], 0, ["not run: --deadline passed"],
                       "")
        timeout = min(timeout, left)
    t0 = time.time()
    text, rc = _run(cmd, timeout)
    log = out / f"{name}-{_safe(kernel)}.log"
    log.write_text(" ".join(cmd) + "\n\n" + text)
    p = parse(text)
    results = [ln[3:] for ln in text.splitlines() if ln.startswith("@@ ")]
    wrong = sum(" WRONG " in f" {r} " for r in results)
    return Run(name, kernel, rc, round(time.time() - t0, 1), p.errors, p.warnings, results,
               wrong, p.heads, str(log))


def table(runs: list[Run], kernels, tools) -> str:
    by = {(r.kernel, r.tool): r for r in runs}
    w = max(len(k) for k in kernels) + 2
    lines = [f"{'kernel':<{w}}" + "".join(f"{t:>12}" for t in tools) + "   results"]
    for k in kernels:
        cells = []
        for t in tools:
            r = by.get((k, t))
            if r is None:
                cells.append("-")
            elif r.returncode == NOT_RUN:
                cells.append("not run")
            elif r.returncode == 124:
                cells.append("TIMEOUT")
            elif r.returncode not in (0, 1) and r.errors == 0:
                cells.append(f"rc={r.returncode}")
            else:
                cells.append(f"{r.errors}" + (f"+{r.warnings}w" if r.warnings else "")
                             + ("!" if r.wrong else ""))
        res = next((r.results for r in runs if r.kernel == k and r.results), [])
        lines.append(f"{k:<{w}}" + "".join(f"{c:>12}" for c in cells) + "   "
                     + "; ".join(x.split(" rel.err")[0].split(" ", 1)[1] for x in res))
    lines.append("cells: errors (+warnings, ! a WRONG result); rc=N: the process failed "
                 "without a report; warm: the run without a sanitizer (errors: none)")
    return "\n".join(lines)


def selftest() -> int:
    clean = ("========= COMPUTE-SANITIZER\n@@ naive 67x45x37 ok rel.err 1e-7\n"
             "========= ERROR SUMMARY: 0 errors\n")
    memcheck = ("========= COMPUTE-SANITIZER\n"
                "========= Invalid __global__ write of size 4 bytes\n"
                "=========     at 0x1f0 in naive_kernel\n"
                "=========     by thread (3,0,0) in block (0,0,0)\n"
                "=========     Address 0x7f00 is out of bounds\n"
                "=========\n"
                "========= Invalid __global__ read of size 16 bytes\n"
                "=========     at 0x2a0 in vectorized_kernel\n"
                "========= ERROR SUMMARY: 2 errors\n")
    race = ("========= COMPUTE-SANITIZER\n"
            "========= Error: Race reported between Write access at 0x3c0 in shared_kernel\n"
            "=========     and Read access at 0x400 in shared_kernel [64 hazards]\n"
            "========= Warning: Race reported between Write access at 0x1 in k\n"
            "========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n")
    summary_only = "========= ERROR SUMMARY: 3 errors\n"
    sync = ("========= Barrier error detected. Divergent thread(s) in warp\n"
            "=========     at 0x100 in k\n========= ERROR SUMMARY: 1 error\n")
    init = ("========= Uninitialized __global__ memory read of size 4 bytes\n"
            "=========     at 0x100 in k\n========= ERROR SUMMARY: 1 error\n")
    untrusted = ("========= Warning: Detected overflow of tracked cuda::barrier structures. "
                 "Results might be incorrect. Try using --num-cuda-barriers to fix the issue\n"
                 "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")
    checks = [(clean, 0, 0), (memcheck, 2, 0), (race, 1, 1), (summary_only, 3, 0), (sync, 1, 0),
              (init, 1, 0), (untrusted, 1, 0)]
    for text, errors, warnings in checks:
        p = parse(text)
        assert (p.errors, p.warnings) == (errors, warnings), (text, p)
    helps = ("  --padding arg (=0)\n  --num-cuda-barriers arg\n  --check-warpgroup-mma arg\n"
             "  --check-bulk-copy arg\nCompute Sanitizer Version 2025.1.0\n")
    assert tool_args("memcheck", helps) == ["--padding", "65536", "--check-bulk-copy", "yes",
                                            "--check-warpgroup-mma", "yes"]
    assert tool_args("racecheck", helps) == ["--racecheck-report", "all",
                                             "--num-cuda-barriers", "32"]
    assert tool_args("racecheck", "") == ["--racecheck-report", "all"]
    assert tool_args("initcheck", helps) == [] and tool_args("memcheck", "") == []
    assert tool_args("initcheck", "  --launch-timeout arg\n") == ["--launch-timeout", "120"]
    assert version_of(helps) == "2025.1.0"
    print("selftest ok")
    return 0


def _target():
    """scripts/sanitize_target.py as a module (its kernel lists, names and shapes)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import sanitize_target

    return sanitize_target


def hopper_only(kernels) -> bool:
    return bool(kernels) and all(k.split(":")[0].startswith("wgmma_") for k in kernels)


def _report(r: Run) -> None:
    status = "clean" if r.clean else ("not run" if r.returncode == NOT_RUN else "PROBLEM")
    print(f"  {r.tool:<10} {r.kernel:<24} {status:<8} errors={r.errors} "
          f"warnings={r.warnings} rc={r.returncode} {r.seconds:.0f}s", flush=True)
    for h in r.heads[:2]:
        print(f"      {h}", flush=True)
    if r.wrong:
        for x in r.results:
            if " WRONG " in f" {x} ":
                print(f"      {x}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--kernels", default="all",
                    help="all, hopper, or names (rung or rung:precision), comma-separated")
    ap.add_argument("--shapes", default=None,
                    help="default 67x45x37,tile+ (Hopper rungs only: plus 300x520x528@4/3)")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run")
    ap.add_argument("--deadline", type=float, default=None,
                    help="seconds for everything: runs not started by then are not run")
    ap.add_argument("--warm", action="store_true",
                    help="first run every kernel once without a sanitizer (fills the cache)")
    ap.add_argument("--padding", type=int, default=1 << 16,
                    help="memcheck guard bytes after each allocation (0: none)")
    ap.add_argument("--num-cuda-barriers", type=int, default=32,
                    help="mbarriers per block racecheck/synccheck track (0: the tool's count)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--sanitizer", default=os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    t0 = time.time()
    deadline = t0 + a.deadline if a.deadline else None
    if shutil.which(a.sanitizer) is None and not Path(a.sanitizer).exists():
        print(f"{a.sanitizer} not found: install the CUDA toolkit's compute-sanitizer "
              f"or pass --sanitizer PATH", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    target = _target()

    kernels = target.expand(a.kernels)
    shapes = a.shapes or (target.HOPPER_SHAPES if hopper_only(kernels)
                          else target.DEFAULT_SHAPES)
    tools = a.tools.split(",")
    out = Path(a.out or (Path(os.environ["OUT"]) / "sanitize" if os.environ.get("OUT")
                         else ROOT / "sanitize-logs"))
    out.mkdir(parents=True, exist_ok=True)
    helps = sanitizer_help(a.sanitizer)
    extra = {t: tool_args(t, helps, a.padding, a.num_cuda_barriers) for t in tools}
    version = version_of(helps)
    print(f"sanitize: {len(kernels)} kernels x {len(tools)} tools, shapes {shapes}, "
          f"{a.jobs} at a time; compute-sanitizer {version}", flush=True)
    for t in tools:
        print(f"  {t}: {' '.join(extra[t]) or '(no extra options)'}", flush=True)
    warm = []
    with ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as ex:
        if a.warm:   # compile everything once, in parallel, before the sanitizers start
            futs = [ex.submit(run_one, a.sanitizer, a.python, None, k, shapes, out, a.timeout,
                              (), deadline) for k in kernels]
            for f in futs:
                warm.append(f.result())
                _report(warm[-1])
            print(f"warm-up {time.time() - t0:.0f} s", flush=True)
        futs = [ex.submit(run_one, a.sanitizer, a.python, t, k, shapes, out, a.timeout,
                          extra[t], deadline) for k in kernels for t in tools]
        runs = []
        for f in futs:
            runs.append(f.result())
            _report(runs[-1])
    print(table(warm + runs, kernels, (["warm"] if warm else []) + tools))
    bad = [r for r in warm + runs if not r.clean]
    summary = {"kernels": kernels, "tools": tools, "shapes": shapes,
               "sanitizer_version": version, "options": extra,
               "seconds": round(time.time() - t0, 1), "clean": not bad,
               "warm": [asdict(r) for r in warm], "runs": [asdict(r) for r in runs]}
    (out / "sanitize.json").write_text(json.dumps(summary, indent=1))
    print(f"total {summary['seconds']:.0f} s; " + ("all clean" if not bad else
          f"{len(bad)} run(s) with problems: " + ", ".join(f"{r.tool}/{r.kernel}" for r in bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
