#!/usr/bin/env python3
"""The machine-readable side of scripts/gpu_check.sh (standard library only: it runs on the
GPU machine's python3 too). Each check appends one JSON line to a checks file; `finish`
turns those lines into one summary JSON and prints the table.

  gpu_summary.py gtest CHECKS NAME GTEST_JSON RC SECONDS [--only PATTERN]
      one entry from a gtest --gtest_output=json file: passed when the binary exited 0 and
      every selected test ran (not skipped) and passed; --only PATTERN (fnmatch on
      Suite.Test) selects tests of the file, e.g. the graph replay tests.
  gpu_summary.py golden CHECKS NAME LOG RC SECONDS
      one `sala golden` run: passed when it exited 0; details: its "N scenarios" line.
  gpu_summary.py lines CHECKS NAME LOG RC SECONDS REGEX
      any command: passed when it exited 0; details: the log lines matching REGEX.
  gpu_summary.py racecheck CHECKS NAME LOG RC SECONDS
      a compute-sanitizer racecheck run (--racecheck-report hazard, so that every hazard is
      printed with its two accesses): passed when the tests in it passed, the run ended (not
      cut by its timeout), every hazard its summary counts was parsed, and each is a known
      one: a potential WAR hazard between an ldmatrix read (ldsm_* / ldmatrix_* wrappers) of
      a shared-memory ring slot and the cp.async write that refills it (the stage-2 kernels'
      producer/consumer rings, ordered by their mbarriers: the warp's reads, __syncwarp, then
      one lane's arrival, which racecheck does not follow; docs/KERNELS.md). Any other
      hazard, or a summary counting hazards the log does not show, fails the check.
  gpu_summary.py bench CHECKS NAME BENCH_JSON RC SECONDS
      `sala bench offline --json`: passed when it exited 0 with at least one row; details:
      every row's name, value, unit, floor and ratio.
  gpu_summary.py finish CHECKS SUMMARY_JSON --mode M [--commit C] [--machine X]
      writes {mode, commit, date, machine, passed, checks: [...]} and prints the table;
      exits 1 when any check failed (a bench fails only when it stops or writes no rows:
      speed never fails it) or when there is no check at all.
  gpu_summary.py table SUMMARY_JSON
      prints the table of a summary written before.
  gpu_summary.py markdown SUMMARY_JSON
      the bench rows of a summary as docs/PERF.md table rows: name | value | ratio to the
      floor (the floor in the row's unit) | commit | date | machine.
"""
import argparse
import datetime
import fnmatch
import json
import os
import re
import sys


def append(checks, entry):
    with open(checks, "a") as f:
        f.write(json.dumps(entry) + "\n")


def base(a, kind):
    return {"name": a.name, "kind": kind, "rc": a.rc, "seconds": a.seconds}


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def gtest(a):
    e = base(a, "correctness")
    try:
        with open(a.json) as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        e.update(passed=False, details={"error": f"no gtest JSON ({err.__class__.__name__})"})
        return e
    tests = [(f"{s['name']}.{t['name']}", t) for s in doc.get("testsuites", [])
             for t in s.get("testsuite", [])]
    if a.only:
        tests = [(n, t) for n, t in tests if fnmatch.fnmatch(n, a.only)]
    failed = [n for n, t in tests if t.get("failures")]
    skipped = [n for n, t in tests if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN"]
    ok = len(tests) - len(failed) - len(skipped)
    e["passed"] = bool(tests) and not failed and not skipped and (a.rc == 0 or bool(a.only))
    e["details"] = {"tests": len(tests), "passed": ok, "failed": failed, "skipped": skipped}
    if not tests:
        e["details"]["error"] = f"no test matches {a.only or '*'}"
    return e


def golden(a):
    e = base(a, "correctness")
    line = [l for l in read_text(a.log).splitlines() if re.match(r"^\d+ scenarios", l)]
    e["passed"] = a.rc == 0 and bool(line)
    e["details"] = {"result": line[-1] if line else "no result line"}
    return e


def lines(a):
    e = base(a, "correctness")
    hits = [l.strip() for l in read_text(a.log).splitlines() if re.search(a.regex, l)]
    e["passed"] = a.rc == 0
    e["details"] = {"lines": hits[-12:]}
    return e


# A hazard block of racecheck: "Potential WAR hazard detected at __shared__ ..." followed by the
# "Read Thread ... at FUNCTION(...)" and "Write Thread ... at FUNCTION(...)" lines.
HAZARD = re.compile(r"Potential (\w+) hazard")
ACCESS = re.compile(r"(Read|Write) Thread \S+ at (?:[\w:]+::)?(\w+)\(")


def racecheck(a):
    e = base(a, "correctness")
    text = read_text(a.log).splitlines()
    kinds, known, other = {}, 0, []
    for i, l in enumerate(text):
        m = HAZARD.search(l)
        if not m:
            continue
        acc = dict(ACCESS.search(x).groups() for x in text[i + 1:i + 3] if ACCESS.search(x))
        key = f"{m.group(1)} {acc.get('Read', '?')} / {acc.get('Write', '?')}"
        kinds[key] = kinds.get(key, 0) + 1
        if (m.group(1) == "WAR" and acc.get("Read", "").startswith(("ldmatrix", "ldsm_"))
                and acc.get("Write") == "cp_async16"):
            known += 1
        else:
            other.append(key)
    summary = [l.strip() for l in text if "RACECHECK SUMMARY" in l]
    tests_ok = any("[  PASSED  ]" in l for l in text) and not any("[  FAILED  ]" in l for l in text)
    finished = bool(summary) and a.rc in (0, 1)  # 1: --error-exitcode on a reported hazard
    # "N hazards displayed (E errors, W warnings)": N = E + W, and each was parsed above (a
    # log in racecheck's analysis format, or one cut by a print limit, hides what they were).
    shown = re.search(r"(\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)",
                      summary[-1]) if summary else None
    parsed = known + len(other)
    complete = shown is not None and int(shown.group(1)) == parsed and \
        int(shown.group(1)) == int(shown.group(2)) + int(shown.group(3))
    e["passed"] = finished and tests_ok and complete and not other
    lines = summary[-1:] + [f"{n} x {k}" for k, n in sorted(kinds.items())]
    if finished and not complete:
        lines.append(f"the summary's hazards are not the {parsed} parsed from the log")
    if known:
        lines.append(f"{known} known (ldmatrix read / cp.async refill of a ring slot, mbarrier-ordered)")
    if not finished:
        lines.append(f"racecheck did not finish (rc {a.rc})")
    e["details"] = {"lines": lines, "known": known, "other": len(other)}
    return e


def bench(a):
    e = base(a, "bench")
    try:
        with open(a.json) as f:
            rows = json.load(f)
    except (OSError, ValueError):
        rows = []
    keys = ("name", "value", "unit", "floor", "ratio")
    e["details"] = {"rows": [{k: r.get(k) for k in keys} for r in rows]}
    e["passed"] = a.rc == 0 and bool(rows)
    return e


def summary_table(s):
    out = [f"==== scripts/gpu_check.sh {s['mode']}: {s['commit']}, {s['machine']}, {s['date']} ===="]
    out.append(f"{'check':<34} {'result':<6} {'s':>5}  details")
    for c in s["checks"]:
        d = c.get("details", {})
        if "rows" in d:
            text = f"{len(d['rows'])} rows"
        elif "tests" in d:
            text = f"{d['passed']}/{d['tests']} passed"
            if d.get("failed"):
                text += " FAILED: " + " ".join(d["failed"][:4])
            if d.get("skipped"):
                text += " SKIPPED: " + " ".join(d["skipped"][:4])
            if d.get("error"):
                text += " " + d["error"]
        elif "result" in d:
            text = d["result"]
        else:
            text = "; ".join(d.get("lines", [])[-3:]) or d.get("error", "")
        result = "pass" if c["passed"] else "FAIL"
        out.append(f"{c['name']:<34} {result:<6} {c.get('seconds', 0):>5}  {text}"[:160])
        for r in d.get("rows", []):
            ratio = r.get("ratio")
            ratio_s = f"{100 * ratio:5.1f}% of floor" if isinstance(ratio, (int, float)) else ""
            out.append(f"    {str(r.get('name')):<30} {r.get('value', 0):>12.3f} {r.get('unit', ''):<12} "
                       f"floor {r.get('floor', 0):.3f}  {ratio_s}")
    out.append("all checks passed" if s["passed"] else "SOME CHECK FAILED")
    return "\n".join(out)


def markdown(s):
    out = []
    for c in s["checks"]:
        for r in c.get("details", {}).get("rows", []):
            out.append(f"| {r['name']} | {r['value']:.3f} {r['unit']} | {100 * r['ratio']:.1f} % "
                       f"({r['floor']:.3f} {r['unit']}) | {s['commit']} | {s['date'][:10]} | "
                       f"{s['machine']} |")
    return "\n".join(out)


def finish(a):
    checks = []
    if os.path.exists(a.checks):
        with open(a.checks) as f:
            checks = [json.loads(l) for l in f if l.strip()]
    s = {"mode": a.mode, "commit": a.commit, "machine": a.machine,
         "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "passed": bool(checks) and all(c["passed"] for c in checks),
         "checks": checks}
    with open(a.summary, "w") as f:
        json.dump(s, f, indent=2)
        f.write("\n")
    print(summary_table(s))
    print(f"summary: {a.summary}")
    return 0 if s["passed"] else 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)

    def entry(name, *extra):
        q = sub.add_parser(name)
        q.add_argument("checks")
        q.add_argument("name")
        for x in extra:
            q.add_argument(x)
        q.add_argument("rc", type=int)
        q.add_argument("seconds", type=int)
        return q

    entry("gtest", "json").add_argument("--only")
    entry("golden", "log")
    entry("lines", "log").add_argument("regex")
    entry("racecheck", "log")
    entry("bench", "json")
    q = sub.add_parser("finish")
    q.add_argument("checks")
    q.add_argument("summary")
    q.add_argument("--mode", required=True)
    q.add_argument("--commit", default="unknown")
    q.add_argument("--machine", default="unknown")
    for name in ("table", "markdown"):
        sub.add_parser(name).add_argument("summary")
    a = p.parse_args()
    if a.cmd == "finish":
        return finish(a)
    if a.cmd in ("table", "markdown"):
        with open(a.summary) as f:
            s = json.load(f)
        print(summary_table(s) if a.cmd == "table" else markdown(s))
        return 0
    append(a.checks, {"gtest": gtest, "golden": golden, "lines": lines, "racecheck": racecheck,
                       "bench": bench}[a.cmd](a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
