"""The Timeline: when each product and each transfer ran, for the overlap figures."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

try:  # the layout helpers need no torch; the algorithms do
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is an optional dependency of gemmlib
    torch = dist = None


class _Completion:
    """When the last of ``n`` gloo collectives completed (perf_counter), set from gloo's thread."""

    def __init__(self, t0: float, n: int):
        self.t, self.left = t0, n

    def done(self, _future) -> None:
        self.t = max(self.t, time.perf_counter())
        self.left -= 1

    def value(self) -> float:
        deadline = time.perf_counter() + 5.0       # callbacks may run just after wait() returns
        while self.left > 0 and time.perf_counter() < deadline:
            time.sleep(1e-4)
        return self.t


@dataclass
class Timeline:
    """What each call did and when, for figures of compute against communication.

    Pass one to the algorithms (``timeline=``); each records a ``call`` span
    and a ``compute`` or ``comm`` span for every product and collective.  On
    a GPU the spans are CUDA events (read once the work is done); on CPU
    processes ``time.perf_counter`` (a collective ends when gloo completes it,
    read from its future).  :meth:`records` returns them in milliseconds from
    the first span this rank recorded; :meth:`gather` collects every rank's.
    """

    rank: int = 0
    _spans: list = field(default_factory=list)   # (call, kind, label, start, end)
    _calls: int = 0
    _origin: object = None                       # the first call's start: time zero

    def _new_call(self) -> int:
        self._calls += 1
        return self._calls - 1

    def _add(self, call, kind, label, start, end):
        self._spans.append((call, kind, label, start, end))

    def records(self) -> list[dict]:
        """Every span as a dict: rank, call, kind, label, start_ms, end_ms (waits for the GPU)."""
        if not self._spans:
            return []
        gpu = not isinstance(self._origin, float)
        out = []
        if gpu:
            for s in self._spans:
                s[4].synchronize()
            t = lambda ev: self._origin.elapsed_time(ev)  # noqa: E731
        else:
            t = lambda v: 1e3 * ((v.value() if isinstance(v, _Completion) else v)  # noqa: E731
                                 - self._origin)
        for call, kind, label, start, end in self._spans:
            out.append(dict(rank=self.rank, call=call, kind=kind, label=label,
                            start_ms=t(start), end_ms=t(end),
                            clock="cuda_event" if gpu else "perf_counter"))
        return out

    def gather(self, group=None) -> list[dict]:
        """Every rank's :meth:`records` (collective: call it on every rank of ``group``).
        CPU clocks are shared by the processes of one machine, so CPU records are put on one
        time axis (from the earliest span of any rank); GPU records keep each rank's own."""
        mine = self.records()
        if mine and mine[0]["clock"] == "perf_counter":
            for r in mine:
                r["abs_start"] = self._origin
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, mine, group=group)
        recs = [r for part in every for r in part]
        starts = [r["abs_start"] for r in recs if "abs_start" in r]
        if starts:
            t0 = min(starts)
            for r in recs:
                shift = 1e3 * (r.pop("abs_start") - t0)
                r["start_ms"] += shift
                r["end_ms"] += shift
        return recs


def _union(intervals) -> list[tuple[float, float]]:
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a, b) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarize(records) -> list[dict]:
    """Per (rank, call): wall, compute and communication time (ms, each the length of the
    union of its spans), the time both ran at once, and the share of the communication that
    compute hid (``hidden``: overlap / comm)."""
    groups: dict = {}
    for r in records:
        groups.setdefault((r["rank"], r["call"]), []).append(r)
    out = []
    for (rank, call), rs in sorted(groups.items()):
        comp = _union([(r["start_ms"], r["end_ms"]) for r in rs if r["kind"] == "compute"])
        comm = _union([(r["start_ms"], r["end_ms"]) for r in rs if r["kind"] == "comm"])
        calls = [r for r in rs if r["kind"] == "call"]
        wall = (max(r["end_ms"] for r in calls) - min(r["start_ms"] for r in calls)) if calls \
            else float("nan")
        ov = _intersection(comp, comm)
        c = _length(comm)
        out.append(dict(rank=rank, call=call, label=calls[0]["label"] if calls else "",
                        wall_ms=wall, compute_ms=_length(comp), comm_ms=c, overlap_ms=ov,
                        hidden=ov / c if c > 0 else float("nan")))
    return out
