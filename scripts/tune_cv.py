"""Leave-one-model-out check of how ``auto`` picks among the tuner's candidates at 65-512
tokens, on the rows of ``python -m gemmlib tune --out`` (no GPU: it replays measurements).

For each training model in turn, the choice for its layers is made from the other models'
rows only, and the chosen candidate's *measured* % of torch on the held-out layer is what
counts.  Two ways to choose are compared with the rule alone and with the best candidate
(the oracle):

* ``class``: the winner of the layer's (tokens, outputs, K) power-of-two class
  (``tune_hopper.table`` + ``tuning.nearest_class``);
* ``model``: per candidate, the measured efficiency of its nearest rows divided by the
  share of the SMs it kept busy there (``tuning.sm_share``), times its share on the new
  layer (``tune_hopper.predict``).

    python3 scripts/tune_cv.py results/tune-2026-11-27/tune-h100-b.json
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def main(path: str) -> None:
    from dataclasses import replace

    from gemmlib import backend, tune_hopper, tuning

    data = json.load(open(path))
    sms = data["meta"].get("sm_count", 132)
    dev = replace(backend.device_info(), sm_count=sms, max_sm_clock_mhz=1980.0,
                  memory_clock_khz=2619000, memory_bus_bits=5120, simulated=False)
    backend.device_info = lambda device_id=None: dev
    rows = [r for r in data["rows"] if "pct_torch" in r]
    model_of = {}
    for use, N, K in tune_hopper.layer_shapes():
        model_of[(N, K)] = use.split()[0]
    shares = tune_hopper.with_shares(rows, data["meta"]["precision"])
    models = sorted(set(model_of.values()))
    out = {k: [] for k in ("rule", "class", "model", "oracle")}
    for held in models:
        train = [r for r in shares if model_of[(r["N"], r["K"])] != held]
        test = [r for r in shares if model_of[(r["N"], r["K"])] == held]
        classes = tune_hopper.table(train)
        cases = {}
        for r in test:
            cases.setdefault((r["M"], r["N"], r["K"]), {})[r["candidate"]] = r
        for (M, N, K), got in sorted(cases.items()):
            cls = tuning.token_class(M, N, K)
            key = cls if cls in classes else tuning.nearest_class(cls, classes)
            c_class = classes[key]["candidate"] if key else "rule"
            c_model = tune_hopper.predict(train, M, N, K, {n: r["share"] for n, r in got.items()})
            pick = {"rule": "rule", "class": c_class, "model": c_model,
                    "oracle": max(got, key=lambda n: got[n]["pct_torch"])}
            line = []
            for how, name in pick.items():
                pct = got[name]["pct_torch"] if name in got else got["rule"]["pct_torch"]
                out[how].append(pct)
                line.append(f"{how} {name:14s} {pct:5.1f}")
            print(f"{held:14s} {M:4d}x{N:5d}x{K:5d}  " + "  ".join(line))
    gm = lambda v: math.exp(statistics.fmean(math.log(x) for x in v))  # noqa: E731
    print("\ngeometric mean % of torch over", len(out["rule"]), "held-out (layer, tokens):")
    for how, v in out.items():
        print(f"  {how:7s} {gm(v):5.1f}   lowest {min(v):5.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
