"""Shared-memory bank conflicts, computed from the kernels' own index functions.

Shared memory is split into 32 banks, 4 bytes wide: the 4-byte word at
address ``w`` (counted in words) lives in bank ``w % 32``.  A bank delivers
one word per cycle, so when the threads of a warp touch *different* words of
the *same* bank, the access is split into several passes ("wavefronts"):
an n-way conflict costs n wavefronts.  Threads reading the *same* word are
served together (a broadcast) and cost nothing extra.

Wide accesses are served in phases: a 4-byte access by the 32 threads at
once, an 8-byte access by half-warps, a 16-byte (float4) access by
quarter-warps of 8 threads (each phase moves up to 128 bytes).  This module
uses that model:

    wavefronts(phase) = max over banks of (distinct words the phase touches in it)
    ideal(phase)      = ceil(distinct words the phase touches / 32)

and reports for one warp instruction the total wavefronts, the ideal, and the
conflict degree ``wavefronts / ideal`` (1.0 = conflict-free).  Extra wavefronts
(``wavefronts - ideal``) are what Nsight Compute counts in
``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum``;
``scripts/experiments/bank_conflicts.sh`` measures them on a GPU to check the model.

Every kernel rung with shared memory has a module-level ``accesses(spec)``
listing its access patterns as :class:`Access` objects built from the *same*
index functions the kernel calls (``spec.index``), so the analysis cannot
drift from the code.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Callable

from gemmlib.spec import Access  # noqa: F401  (re-exported)

BANKS = 32
WARP = 32


# Access lives in gemmlib.spec (a rung declares its accesses there, below this module).
@dataclass(frozen=True)
class Result:
    access: Access
    warp: int
    wavefronts: int
    ideal: int

    @property
    def degree(self) -> float:
        return self.wavefronts / self.ideal if self.ideal else 1.0

    @property
    def extra(self) -> int:
        """Wavefronts beyond the ideal: what ncu's bank-conflict counters add up."""
        return self.wavefronts - self.ideal

    def __str__(self) -> str:
        a = self.access
        lbl = f" {a.label}" if a.label else ""
        return (f"{a.array:>4} {a.op:<5} {a.width * 4:>2} B/thread: {self.wavefronts} wavefronts, "
                f"ideal {self.ideal} -> {self.degree:.1f}-way{lbl}")


def wavefronts(words_per_thread: list[list[int]], width: int = 1) -> tuple[int, int]:
    """(wavefronts, ideal) for one warp instruction; ``words_per_thread[lane]`` lists the
    words lane touches (inactive lanes: empty lists)."""
    if width not in (1, 2, 4):
        raise ValueError(f"a thread moves 1, 2 or 4 words per shared access, not {width}")
    lanes_per_phase = WARP // width  # 128 bytes per phase
    total = ideal = 0
    for start in range(0, len(words_per_thread), lanes_per_phase):
        words = {w for lane in words_per_thread[start:start + lanes_per_phase] for w in lane}
        if not words:
            continue
        per_bank: dict[int, int] = {}
        for w in words:
            per_bank[w % BANKS] = per_bank.get(w % BANKS, 0) + 1
        total += max(per_bank.values())
        ideal += math.ceil(len(words) / BANKS)
    return total, ideal


def analyze_access(access: Access, warp: int = 0, threads: int | None = None) -> Result:
    lanes = range(warp * WARP, warp * WARP + WARP)
    words = [access.words(t) if threads is None or t < threads else [] for t in lanes]
    w, i = wavefronts(words, access.width)
    return Result(access, warp, w, i)


def accesses(spec) -> list[Access]:
    """The shared-memory access patterns the rung's module declares for ``spec``."""
    mod = importlib.import_module(spec.module)
    if not hasattr(mod, "accesses"):
        return []
    return mod.accesses(spec)


def analyze(spec, warps: str | int = "worst") -> list[Result]:
    """One Result per access pattern of ``spec``.

    ``warps="worst"`` reports, per pattern, the warp of the block with the most
    wavefronts; an int reports that warp.
    """
    out = []
    nwarps = max(spec.threads // WARP, 1)
    for acc in accesses(spec):
        if warps == "worst":
            res = [analyze_access(acc, w, spec.threads) for w in range(nwarps)]
            out.append(max(res, key=lambda r: (r.degree, r.wavefronts)))
        else:
            out.append(analyze_access(acc, int(warps), spec.threads))
    return out


def predict(spec, M: int, N: int, K: int) -> dict:
    """Predicted Nsight Compute counters for one launch on (M, N, K).

    Sums, over every warp of every block and every k-tile, the shared-memory
    instructions and their extra wavefronts (the model above), split into
    loads and stores -- to compare with ``smsp__inst_executed_op_shared_{ld,st}.sum``
    and ``l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{ld,st}.sum``.
    Exact for problems that are multiples of the tile; the epilogue does not
    touch shared memory.
    """
    geo = spec.launch(M, N, K)
    blocks = geo.grid[0] * geo.grid[1] * geo.grid[2]
    tiles = -(-K // spec.params["BK"])
    nwarps = max(spec.threads // WARP, 1)
    out = {"ld_instructions": 0, "st_instructions": 0, "ld_conflicts": 0, "st_conflicts": 0}
    for acc in accesses(spec):
        kind = "ld" if acc.op == "load" else "st"
        for w in range(nwarps):
            r = analyze_access(acc, w, spec.threads)
            out[f"{kind}_instructions"] += acc.count * blocks * tiles
            out[f"{kind}_conflicts"] += r.extra * acc.count * blocks * tiles
    return out


def bank_map(access: Access, warp: int = 0) -> list[list[int]]:
    """banks[lane] = the banks lane touches (for figures)."""
    return [[w % BANKS for w in access.words(t)]
            for t in range(warp * WARP, warp * WARP + WARP)]


def report(spec) -> str:
    """A text table of every access pattern of ``spec`` and its conflict degree."""
    lines = [f"{spec.name}: shared-memory accesses (worst warp of the block)"]
    lines += ["  " + str(r) for r in analyze(spec)]
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    from gemmlib.kernels import LADDER, get

    p = argparse.ArgumentParser(prog="python -m gemmlib.banks",
                                description="bank-conflict degree of each kernel's shared accesses")
    p.add_argument("kernels", nargs="*")
    args = p.parse_args(argv)
    for name in args.kernels or LADDER:
        spec = get(name)
        if accesses(spec):
            print(report(spec))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
