#!/usr/bin/env python3
"""Checks the dependency direction of docs/ARCHITECTURE.md ("Parts and layers").

Two kinds of edges are read from a source tree ROOT (default: this repository):
  * includes: `#include "<dir>/..."` (and `#include "../<dir>/..."`) in every file under
    ROOT/src/<part>/, where a part is a directory under src/ (backend/cpu and backend/cuda
    are parts of their own inside backend);
  * links: `target_link_libraries(<target> ... <libs>)` in every ROOT/src/**/CMakeLists.txt,
    with `${var}` of an enclosing `foreach(var a b c)` expanded, mapped to parts by
    TARGET_PART.
  * sources: a part's library (add_library / add_executable / target_sources) compiling
    a file of another part's directory (its own sub-parts excepted).
Every include or link between two different parts must be in ALLOWED, and no library may
compile another part's sources. Prints one line per violation
(file:line: part -> part) and exits 1 if there is any, 0 otherwise.

Usage: check_layering.py [ROOT]
"""
import os
import re
import sys

# What each part may use directly, mirroring docs/ARCHITECTURE.md. "Downwards" is
# transitive (cli may include a model header), so each part lists everything below it.
ALLOWED = {
    "core": set(),
    # The factory (backend/factory.cpp) makes a CPU or a CUDA backend.
    "backend": {"core", "backend/cpu", "backend/cuda"},
    "backend/cpu": {"backend", "core"},
    "backend/cuda": {"backend", "core"},
    "model": {"backend", "core"},
    # The engine keeps each request's grammar matcher (src/grammar, core only).
    "grammar": {"core"},
    "engine": {"model", "backend", "core", "grammar"},
    "tokenizer": {"core"},
    "server": {"engine", "model", "backend", "core", "tokenizer", "grammar"},
    # bench serve counts tokens with the served model's tokenizer (harness/token_count.cpp),
    # exactly as the server does; the tokenizer depends on core only.
    "harness": {"core", "tokenizer"},
    "cli": {"server", "engine", "model", "backend", "core", "tokenizer", "harness", "grammar"},
}

# CMake targets of each part (third-party targets are not parts and are ignored).
TARGET_PART = {
    "sala_core": "core",
    "sala_backend": "backend",
    "sala_cuda": "backend/cuda",
    "sala_model": "model",
    "sala_engine": "engine",
    "sala_tokenizer": "tokenizer",
    "sala_grammar": "grammar",
    "sala_server": "server",
    "sala_harness": "harness",
    "sala": "cli",
}

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def part_of(rel):
    """Part of a path relative to src/ ("backend/cuda/x.cu" -> "backend/cuda"), or None."""
    segs = rel.replace(os.sep, "/").split("/")
    if len(segs) < 2:
        return None
    if segs[0] == "backend" and len(segs) > 2 and f"backend/{segs[1]}" in ALLOWED:
        return f"backend/{segs[1]}"
    return segs[0] if segs[0] in ALLOWED else None


def include_edges(src):
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, name)
            here = part_of(os.path.relpath(path, src))
            if here is None:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc.startswith("."):  # relative: resolve against the including file
                        target = os.path.normpath(os.path.join(dirpath, inc))
                        rel = os.path.relpath(target, src)
                        if rel.startswith(".."):
                            continue
                    else:
                        rel = inc
                    there = part_of(rel)
                    if there is not None and there != here:
                        yield path, lineno, here, there


def strip_comment(line):
    return line.split("#", 1)[0].rstrip("\n") + "\n"


def link_edges(src):
    for dirpath, _, files in os.walk(src):
        if "CMakeLists.txt" not in files:
            continue
        path = os.path.join(dirpath, "CMakeLists.txt")
        with open(path, encoding="utf-8") as f:
            lines = [strip_comment(x) for x in f]
        text = "".join(lines)
        loops = {m.group(1): m.group(2).split()
                 for m in re.finditer(r"foreach\s*\(\s*(\w+)\s+([^)]*)\)", text)}
        for m in re.finditer(r"target_link_libraries\s*\(([^)]*)\)", text):
            words = m.group(1).split()
            lineno = text.count("\n", 0, m.start()) + 1
            owners = loops.get(words[0][2:-1], []) if words[0].startswith("${") else [words[0]]
            libs = []
            for w in words[1:]:
                v = re.fullmatch(r"\$\{(\w+)\}", w)
                libs += loops.get(v.group(1), []) if v else [w]
            for owner in owners:
                here = TARGET_PART.get(owner)
                if here is None:
                    continue
                for lib in libs:
                    there = TARGET_PART.get(lib)
                    if there is not None and there != here:
                        yield path, lineno, here, there


def source_edges(src, root):
    """Sources a part's library compiles from another part's directory (a library is
    compiled from its own part's files and its sub-parts': backend owns backend/cpu)."""
    for dirpath, _, files in os.walk(src):
        if "CMakeLists.txt" not in files:
            continue
        path = os.path.join(dirpath, "CMakeLists.txt")
        with open(path, encoding="utf-8") as f:
            text = "".join(strip_comment(x) for x in f)
        for m in re.finditer(r"(?:add_library|add_executable|target_sources)\s*\(([^)]*)\)", text):
            words = m.group(1).split()
            here = TARGET_PART.get(words[0])
            if here is None:
                continue
            lineno = text.count("\n", 0, m.start()) + 1
            for w in words[1:]:
                w = w.replace("${SALA_SOURCE_DIR}", root).replace("${CMAKE_CURRENT_SOURCE_DIR}", dirpath)
                if "${" in w or not w.endswith(SOURCE_EXT):
                    continue
                rel = os.path.relpath(os.path.normpath(os.path.join(dirpath, w)), src)
                there = part_of(rel)
                if there is not None and there != here and not there.startswith(here + "/"):
                    yield path, lineno, here, there


def check(root):
    src = os.path.join(root, "src")
    if not os.path.isdir(src):
        print(f"check_layering: {src} is not a directory", file=sys.stderr)
        return 2
    bad = 0
    for kind, edges in (("include", include_edges(src)), ("link", link_edges(src))):
        for path, lineno, here, there in edges:
            if there not in ALLOWED[here]:
                bad += 1
                print(f"{os.path.relpath(path, root)}:{lineno}: {kind} {here} -> {there} "
                      f"is not allowed ({here} may use: {', '.join(sorted(ALLOWED[here])) or 'nothing'})")
    for path, lineno, here, there in source_edges(src, root):
        bad += 1
        print(f"{os.path.relpath(path, root)}:{lineno}: the {here} library compiles a source of "
              f"{there}; each part is its own library")
    if bad:
        print(f"check_layering: {bad} violation(s) of docs/ARCHITECTURE.md's dependency direction")
        return 1
    print("check_layering: every include and link points downwards")
    return 0


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    sys.exit(check(os.path.abspath(root)))
