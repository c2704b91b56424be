"""The per-shape table of the models suite against issue 18's targets (no GPU).

    python3 scripts/models_table.py results/models-<gpu>-<date>.json [--before OLD.json]

Per precision: the geometric mean of % of the framework's matmul, the rows under 60%,
the decode rows (M <= 16) under both 80% of cuBLAS and 75% of the copy bandwidth, and
for 3xtf32 the rows of 2MNK >= 2*1024^3 under 95%; with --before, each row's change.
"""
import argparse
import json
import math


def key(r):
    return (r["precision"], r.get("model"), r.get("layer"), r["M"], r["N"], r["K"])


def geomean(xs):
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def misses(r):
    p, pct = r["precision"], r["pct_of_cublas"]
    out = []
    if p in ("fp16", "bf16"):
        if pct < 60:
            out.append("<60%")
        if r["M"] <= 16 and pct < 80 and (r.get("dram_pct_of_copy") or 0) < 75:
            out.append("decode")
    elif 2 * r["M"] * r["N"] * r["K"] >= 2 * 1024 ** 3 and pct < 95:
        out.append("<95%")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--before")
    ap.add_argument("--all", action="store_true", help="every row, not only the misses")
    a = ap.parse_args()
    data = json.load(open(a.path))
    old = {key(r): r for r in json.load(open(a.before))["rows"]} if a.before else {}
    print(f"# {data['meta'].get('gpu')} ({a.path})")
    for p in ("fp16", "bf16", "3xtf32"):
        rows = [r for r in data["rows"] if r["precision"] == p]
        if not rows:
            continue
        line = f"\n## {p}: {len(rows)} shapes, geometric mean {geomean(r['pct_of_cublas'] for r in rows):.1f}%"
        if old:
            line += f" (before: {geomean(old[key(r)]['pct_of_cublas'] for r in rows if key(r) in old):.1f}%)"
        print(line + f"; under 60%: {sum(r['pct_of_cublas'] < 60 for r in rows)}; "
              f"decode misses: {sum('decode' in misses(r) for r in rows)} of "
              f"{sum(r['M'] <= 16 for r in rows)}")
        print("\n| model | layer | M | N | K | kernel | us | % of cuBLAS | before | DRAM % of copy | missed |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            m = misses(r)
            if not (m or a.all):
                continue
            b = old.get(key(r))
            dp = r.get("dram_pct_of_copy")
            cells = [r.get("model"), r.get("layer") or "", r["M"], r["N"], r["K"], r["kernel"],
                     f"{r['median_ms'] * 1e3:.1f}", f"{r['pct_of_cublas']:.1f}",
                     f"{b['pct_of_cublas']:.1f}" if b else "-", f"{dp:.0f}" if dp else "-",
                     ", ".join(m)]
            print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
