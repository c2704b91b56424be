"""compute-sanitizer over every registered kernel: memcheck, racecheck, synccheck, initcheck.

    python3 scripts/sanitize.py [--tools memcheck,racecheck,synccheck,initcheck]
                                [--kernels all|name,name] [--shapes 67x45x37,tile+]
                                [--jobs 8] [--out DIR] [--timeout 300]
    python3 scripts/sanitize.py --selftest      # the report parser, no GPU needed

One process per (tool, kernel), several at once (``--jobs``), each running
``scripts/sanitize_target.py`` under

    compute-sanitizer --tool T --report-api-errors no --error-exitcode 1 ...

on each shape: 67x45x37 (nothing a multiple of 4: the scalar edge paths) and
``tile+`` (one past a block tile in M, N and K, with N and K multiples of 4:
the float4 paths and a second k-tile).  ``--report-api-errors no`` because
the CUDA Python stack probes driver entry points that do not exist, which
memcheck would otherwise report as errors for any kernel.

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
        if WARNING_HEAD.match(body):
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


def run_one(sanitizer, python, tool, kernel, shapes, out: Path, timeout) -> Run:
    cmd = [sanitizer, "--tool", tool, "--report-api-errors", "no", "--error-exitcode", "1",
           "--print-limit", "50"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    cmd += [python, str(ROOT / "scripts" / "sanitize_target.py"), kernel, shapes]
    # SANITIZE_SIM=1 with a fake --sanitizer: a dry run of this script in the simulator
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=os.environ.get("SANITIZE_SIM", "0"),
               PYTHONUNBUFFERED="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    t0 = time.time()
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                            cwd=ROOT)
        text, rc = cp.stdout + cp.stderr, cp.returncode
    except subprocess.TimeoutExpired as e:
        text = e.stdout or ""
        text = text.decode(errors="replace") if isinstance(text, bytes) else text
        text += f"\n[sanitize.py] TIMEOUT after {timeout} s\n"
        rc = 124
    log = out / f"{tool}-{kernel}.log"
    log.write_text(" ".join(cmd) + "\n\n" + text)
    p = parse(text)
    results = [ln[3:] for ln in text.splitlines() if ln.startswith("@@ ")]
    wrong = sum(" WRONG " in f" {r} " for r in results)
    return Run(tool, kernel, rc, round(time.time() - t0, 1), p.errors, p.warnings, results,
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
            elif r.returncode not in (0, 1) and r.errors == 0:
                cells.append(f"rc={r.returncode}")
            else:
                cells.append(f"{r.errors}" + (f"+{r.warnings}w" if r.warnings else ""))
        res = next((r.results for r in runs if r.kernel == k and r.results), [])
        lines.append(f"{k:<{w}}" + "".join(f"{c:>12}" for c in cells) + "   "
                     + "; ".join(x.split(" rel.err")[0].split(" ", 1)[1] for x in res))
    lines.append("cells: errors (+warnings); rc=N: the process failed without a report")
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
    checks = [(clean, 0, 0), (memcheck, 2, 0), (race, 1, 1), (summary_only, 3, 0), (sync, 1, 0),
              (init, 1, 0)]
    for text, errors, warnings in checks:
        p = parse(text)
        assert (p.errors, p.warnings) == (errors, warnings), (text, p)
    print("selftest ok")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--kernels", default="all")
    ap.add_argument("--shapes", default="67x45x37,tile+")
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sanitizer", default=os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    if shutil.which(a.sanitizer) is None and not Path(a.sanitizer).exists():
        print(f"{a.sanitizer} not found: install the CUDA toolkit's compute-sanitizer "
              f"or pass --sanitizer PATH", file=sys.stderr)
        return 1
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")
    from gemmlib.kernels import LADDER

    kernels = list(LADDER) if a.kernels == "all" else a.kernels.split(",")
    tools = a.tools.split(",")
    out = Path(a.out or (Path(os.environ["OUT"]) / "sanitize" if os.environ.get("OUT")
                         else ROOT / "sanitize-logs"))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(t, k) for k in kernels for t in tools]
    t0 = time.time()
    print(f"sanitize: {len(kernels)} kernels x {len(tools)} tools, shapes {a.shapes}, "
          f"{a.jobs} at a time", flush=True)
    with ThreadPoolExecutor(max_workers=max(a.jobs, 1)) as ex:
        futs = [ex.submit(run_one, a.sanitizer, a.python, t, k, a.shapes, out, a.timeout)
                for t, k in jobs]
        runs = []
        for f in futs:
            r = f.result()
            runs.append(r)
            status = "clean" if r.clean else "PROBLEM"
            print(f"  {r.tool:<10} {r.kernel:<16} {status:<8} errors={r.errors} "
                  f"warnings={r.warnings} rc={r.returncode} {r.seconds:.0f}s", flush=True)
            for h in r.heads[:2]:
                print(f"      {h}", flush=True)
    print(table(runs, kernels, tools))
    bad = [r for r in runs if not r.clean]
    summary = {"kernels": kernels, "tools": tools, "shapes": a.shapes,
               "seconds": round(time.time() - t0, 1), "clean": not bad,
               "runs": [asdict(r) for r in runs]}
    (out / "sanitize.json").write_text(json.dumps(summary, indent=1))
    print(f"total {summary['seconds']:.0f} s; " + ("all clean" if not bad else
          f"{len(bad)} run(s) with problems: " + ", ".join(f"{r.tool}/{r.kernel}" for r in bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
