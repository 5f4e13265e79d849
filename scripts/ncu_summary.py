#!/usr/bin/env python3
"""Mean GPU time per kernel over the last kernels of an ncu CSV log.

ncu --csv --metrics gpu__time_duration.sum,... writes one row per (kernel launch, metric);
this groups them by launch ID and prints, for the last --last launches (the decode steps at
the end of a `sala bench offline --long-decode-*` run), each kernel name and grid with its
count and mean duration in microseconds. Durations are under the profiler's clocks and cache
flushes: compare kernels with each other, not with graph-replay step times.

  scripts/ncu_summary.py ncu.csv --last 224
  scripts/ncu_summary.py ncu.csv --metrics   (also each kernel's mean of every other metric)
"""
import argparse
import csv
import io
from collections import OrderedDict, defaultdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=0, help="only the last N launches (0: all)")
    ap.add_argument("--metrics", action="store_true",
                    help="after the times, each kernel's mean of every other metric collected")
    a = ap.parse_args()
    with open(a.csv, encoding="utf-8", errors="replace") as f:
        lines = [ln for ln in f if not ln.startswith("==")]  # ncu's own messages
    launches: "OrderedDict[str, dict]" = OrderedDict()
    for r in csv.DictReader(io.StringIO("".join(lines))):
        # Demangled names (--kernel-name-base demangled) carry namespaces and parameters.
        name = r["Kernel Name"].replace("(anonymous namespace)::", "").split("(")[0]
        k = launches.setdefault(r["ID"], {"name": name,
                                          "grid": r["Grid Size"], "block": r["Block Size"]})
        k[r["Metric Name"]] = r["Metric Value"]
    items = list(launches.values())
    if a.last > 0:
        items = items[-a.last:]
    by = defaultdict(list)
    for k in items:
        if "gpu__time_duration.sum" in k:
            ns = float(k["gpu__time_duration.sum"].replace(",", ""))
            by[(k["name"][-48:], k["grid"], k["block"])].append(ns / 1000.0)
    total = sum(sum(v) for v in by.values())
    print(f"{'kernel':48} {'grid':>14} {'block':>12} {'n':>5} {'mean us':>9} {'share':>6}")
    for (name, grid, block), v in sorted(by.items(), key=lambda t: -sum(t[1])):
        print(f"{name:48} {grid:>14} {block:>12} {len(v):5d} {sum(v) / len(v):9.1f} "
              f"{100 * sum(v) / max(total, 1e-9):5.1f}%")
    if a.metrics:
        names = sorted({m for k in items for m in k
                        if m not in ("name", "grid", "block", "gpu__time_duration.sum")})
        for kernel in sorted({k["name"] for k in items}):
            ks = [k for k in items if k["name"] == kernel]
            print(f"\n{kernel} ({len(ks)} launches)")
            for m in names:
                vals = [float(k[m].replace(",", "")) for k in ks if k.get(m, "").replace(",", "")
                        .replace(".", "", 1).isdigit()]
                if vals:
                    print(f"  {m:72} {sum(vals) / len(vals):10.2f}")


if __name__ == "__main__":
    main()
