"""Leave-one-model-out check of how ``auto`` picks among the tuner's candidates at 65-512
tokens, on the rows of ``python -m gemmlib tune --out`` (no GPU: it replays measurements).

For each training model in turn, the table is made from the other models' rows only
(``tune_hopper.table``), and the candidate it gives the held-out model's layers
(their class's winner, or the nearest class's: ``tuning.nearest_class``) counts with its
*measured* % of torch there.  Printed beside the rule alone and the best candidate (the
oracle).

    python3 scripts/tune_cv.py results/tune-2026-11-27/tune-h100.json
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")


def main(path: str) -> None:
    from gemmlib import tune_hopper, tuning

    data = json.load(open(path))
    shares = [r for r in data["rows"] if "pct_torch" in r]
    model_of = {(N, K): use.split()[0] for use, N, K in tune_hopper.layer_shapes()}
    models = sorted(set(model_of.values()))
    out = {k: [] for k in ("rule", "class", "oracle")}
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
            pick = {"rule": "rule", "class": c_class,
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
