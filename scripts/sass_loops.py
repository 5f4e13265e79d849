#!/usr/bin/env python3
"""Static instruction counts of CUDA kernels from a SASS listing (cuobjdump -sass).

For kernels that are bound by how many instructions they issue (the int4 GEMV, session 16's
ncu), the SASS of a loop body says where the issue slots go without a GPU: per kernel whose
name contains PATTERN, its instruction count and every loop (a backward branch and the
instructions between its target and it) with the opcodes it holds, most frequent first.
Counts are static: a loop's body includes both sides of its branches (e.g. the partial-tile
copies), so compare variants of one kernel, not kernels with each other.

Usage: sass_loops.py LISTING.sass [PATTERN] [--min N]   (loops of fewer than N instructions,
default 16, are left out)
"""
import collections
import re
import sys

INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", re.M)
BRANCH = re.compile(r"\bBRA(?:\.\S+)?\s+(?:\S+,\s*)?(0x[0-9a-f]+)")
GUARD = re.compile(r"^@!?U?P\w+\s+")


def kernels(text):
    """(name, [(address, instruction)]) per function of a cuobjdump -sass listing."""
    parts = re.split(r"\n\s*Function : ", "\n" + text)
    for part in parts[1:]:
        name = part.split("\n", 1)[0].strip()
        yield name, [(int(a, 16), t) for a, t in INSTR.findall(part)]


def opcode(instruction):
    return GUARD.sub("", instruction).split()[0]


def loops(instrs):
    """(start, end, body) of every backward branch, in the listing's order."""
    for addr, text in instrs:
        m = BRANCH.search(text)
        if m and int(m.group(1), 16) <= addr:
            start = int(m.group(1), 16)
            yield start, addr, [t for a, t in instrs if start <= a <= addr]


def report(text, pattern="", min_len=16, top=14):
    out = []
    for name, instrs in kernels(text):
        if pattern not in name:
            continue
        out.append(f"{name}: {len(instrs)} instructions")
        for start, end, body in loops(instrs):
            if len(body) < min_len:
                continue
            hist = collections.Counter(opcode(t) for t in body).most_common(top)
            out.append(f"  loop {start:#x}-{end:#x}: {len(body)} instructions; "
                       + ", ".join(f"{op} {n}" for op, n in hist))
    return "\n".join(out)


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    min_len = 16
    if "--min" in argv:
        min_len = int(argv[argv.index("--min") + 1])
        args.remove(str(min_len))
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[0]) as f:
        text = f.read()
    print(report(text, args[1] if len(args) > 1 else "", min_len))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
