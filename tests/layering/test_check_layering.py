#!/usr/bin/env python3
"""scripts/check_layering.py on tiny synthetic trees: a clean tree passes, and each kind of
violation (an upward include, a relative one, a sibling backend's header, an upward link,
a link through a foreach variable, a library compiling another part's source) fails with
the offending file:line named.

Usage: test_check_layering.py CHECKER
"""
import os
import subprocess
import sys
import tempfile

CHECKER = sys.argv[1]

CLEAN = {
    "src/core/config.h": "#pragma once\n#include <string>\n",
    "src/backend/backend.h": '#pragma once\n#include "core/config.h"\n',
    "src/backend/cuda/k.cu": '#include "backend/backend.h"\n#include "cuda_local.cuh"\n',
    "src/model/m.cpp": '#include "backend/backend.h"\n#include "model/m.h"\n',
    "src/harness/t.cpp": '#include "tokenizer/tokenizer.h"\n',
    "src/cli/c.cpp": '#include "server/launch.h"\n#include "harness/eval.h"\n',
    "src/backend/CMakeLists.txt": "add_library(sala_backend STATIC cpu/a.cpp)\n"
                                  "target_link_libraries(sala_backend PUBLIC sala_core sala_cuda)\n",
    "src/model/CMakeLists.txt": "add_library(sala_model STATIC m.cpp)  # comment: sala_server\n"
                                "target_link_libraries(sala_model PUBLIC sala_backend fmt::fmt)\n",
    "src/cli/CMakeLists.txt": "add_executable(sala main.cpp ${GLOBBED})\n"
                              "foreach(lib sala_server sala_harness)\n"
                              "  target_link_libraries(sala PRIVATE ${lib})\nendforeach()\n",
}

# (files to add or replace, text the checker must print)
VIOLATIONS = [
    ({"src/backend/backend.h": '#pragma once\n#include "core/config.h"\n#include "model/step.h"\n'},
     "src/backend/backend.h:3: include backend -> model"),
    ({"src/core/x.cpp": '#include "../engine/engine.h"\n'},
     "src/core/x.cpp:1: include core -> engine"),
    ({"src/backend/cuda/k.cu": '#include "backend/cpu/gla_reference.h"\n'},
     "src/backend/cuda/k.cu:1: include backend/cuda -> backend/cpu"),
    ({"src/tokenizer/tok.cpp": '#include "core/error.h"\n#include "model/weights.h"\n'},
     "src/tokenizer/tok.cpp:2: include tokenizer -> model"),
    ({"src/model/CMakeLists.txt": "add_library(sala_model STATIC m.cpp)\n"
                                  "target_link_libraries(sala_model PUBLIC sala_engine)\n"},
     "src/model/CMakeLists.txt:2: link model -> engine"),
    ({"src/harness/CMakeLists.txt": "foreach(lib sala_tokenizer sala_server)\n"
                                    "  target_link_libraries(sala_harness PRIVATE ${lib})\nendforeach()\n"},
     "src/harness/CMakeLists.txt:2: link harness -> server"),
    ({"src/model/CMakeLists.txt": "add_library(sala_model STATIC m.cpp\n"
                                  "  ${SALA_SOURCE_DIR}/src/backend/cpu/cpu_backend.cpp)\n"},
     "src/model/CMakeLists.txt:1: the model library compiles a source of backend/cpu"),
]


def run(files):
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


failures = 0
rc, out = run(CLEAN)
if rc != 0:
    failures += 1
    print(f"FAIL: the clean tree was refused (rc {rc}):\n{out}")
for extra, expect in VIOLATIONS:
    rc, out = run({**CLEAN, **extra})
    if rc != 1 or expect not in out:
        failures += 1
        print(f"FAIL: expected rc 1 and '{expect}', got rc {rc}:\n{out}")
    elif out.count(": include ") + out.count(": link ") + out.count(" compiles a source of ") != 1:
        failures += 1
        print(f"FAIL: expected exactly one violation for '{expect}':\n{out}")
    else:
        print(f"ok: {expect}")
print(f"{len(VIOLATIONS) + 1 - failures} of {len(VIOLATIONS) + 1} cases passed")
sys.exit(1 if failures else 0)
