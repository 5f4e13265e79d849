#!/usr/bin/env python3
"""Where a graph-replayed step's GPU time goes, from a ktrace CSV (scripts/ktrace/ktrace.cpp).

Kernels of one graph launch share a correlation id. For each graph (recording) this takes its
last --graph-launches launches and orders every launch's kernels by start time. The span of a
launch (first start to last end) is split exactly into
  - idle: time when no kernel of the launch ran (launch gaps, dependency waits);
  - frontier: per kernel, how far its end pushed the latest end so far (max(0, end - frontier)
    once it starts; the part that overlaps earlier kernels counts for them). A kernel hidden
    under an earlier one (PDL prologues, parallel branches) contributes 0.
It prints, per graph, the mean span and per kernel name (in first-launch order) the launches
per step, mean duration and mean frontier contribution per step, plus the idle total.

  scripts/ktrace/ktrace_summary.py trace.csv --graph-launches 8 [--graph ID] [--top 40]
"""
import argparse
import csv
import re
import shutil
import subprocess
from collections import OrderedDict, defaultdict


def short_names(names):
    """Demangled, without parameter lists and namespaces, when c++filt exists."""
    out = {n: n for n in names}
    if shutil.which("c++filt"):
        mangled = [n for n in names if n.startswith("_Z")]
        if mangled:
            res = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True,
                                 text=True, check=False).stdout.splitlines()
            for m, d in zip(mangled, res):
                out[m] = d
    for n, d in out.items():
        d = re.sub(r"\(anonymous namespace\)::|sala::cuda::|sala::", "", d)
        d = re.sub(r"^void ", "", d)
        d = re.sub(r"\((?:[^()]|\([^()]*\))*\)$", "", d)  # trailing parameter list
        out[n] = d
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graph-launches", type=int, default=8, help="last N launches per graph")
    ap.add_argument("--graph", type=int, default=-1, help="only this graph id")
    ap.add_argument("--top", type=int, default=60, help="kernel rows per graph")
    ap.add_argument("--min-kernels", type=int, default=20,
                    help="skip graphs of fewer kernels per launch")
    ap.add_argument("--timeline", action="store_true",
                    help="also every kernel of each graph's last launch: start offset, duration, "
                         "start minus the frontier (negative: overlapped), frontier push")
    a = ap.parse_args()
    launches = OrderedDict()  # (graph, correlation) -> rows
    with open(a.csv, encoding="utf-8", errors="replace") as f:
        for r in csv.reader(f):
            if r[0] == "start_ns":
                continue
            graph = int(r[2])
            if graph == 0:
                continue
            row = (int(r[0]), int(r[1]), ",".join(r[10:]), r[6], r[7])
            launches.setdefault((graph, int(r[4])), []).append(row)
    by_graph = defaultdict(list)
    for (graph, _), rows in launches.items():
        by_graph[graph].append(sorted(rows))
    names = short_names({k[2] for rows in launches.values() for k in rows})
    for graph, runs in by_graph.items():
        if a.graph >= 0 and graph != a.graph:
            continue
        runs = runs[-a.graph_launches:]
        if len(runs[0]) < a.min_kernels:
            continue
        spans, idle = [], []
        dur, front, count = defaultdict(float), defaultdict(float), defaultdict(int)
        order = []
        for rows in runs:
            t0, frontier, gap = rows[0][0], rows[0][0], 0
            for s, e, n, grid, _ in rows:
                key = (names[n], grid)
                if key not in dur:
                    order.append(key)
                if s > frontier:
                    gap += s - frontier
                    frontier = s
                dur[key] += e - s
                count[key] += 1
                if e > frontier:
                    front[key] += e - frontier
                    frontier = e
            spans.append(frontier - t0)
            idle.append(gap)
        n = len(runs)
        span = sum(spans) / n / 1e3
        print(f"graph {graph}: {n} launches, {len(runs[0])} kernels each, span {span:.1f} us "
              f"(min {min(spans) / 1e3:.1f}), idle {sum(idle) / n / 1e3:.1f} us")
        print(f"  {'per step':>8} {'dur us':>8} {'front us':>9} {'front %':>7}  kernel [grid]")
        rows = sorted(order, key=lambda k: -front[k])[:a.top]
        for k in rows:
            print(f"  {count[k] / n:8.0f} {dur[k] / n / 1e3:8.1f} {front[k] / n / 1e3:9.1f} "
                  f"{100 * front[k] / n / 1e3 / span:6.1f}%  {k[0][:90]} [{k[1]}]")
        if a.timeline:
            rows = runs[-1]
            t0 = frontier = rows[0][0]
            print(f"  {'start us':>9} {'dur us':>7} {'vs front':>8} {'push':>6}  kernel [grid]")
            for s, e, nm, grid, _ in rows:
                push = max(0, e - max(frontier, s))
                print(f"  {(s - t0) / 1e3:9.2f} {(e - s) / 1e3:7.2f} {(s - frontier) / 1e3:8.2f} "
                      f"{push / 1e3:6.2f}  {names[nm][:80]} [{grid}]")
                frontier = max(frontier, e)


if __name__ == "__main__":
    main()
