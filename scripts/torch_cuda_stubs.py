#!/usr/bin/env python3
"""Stand-in CUDA libraries so that PyPI's Linux torch wheel imports without its NVIDIA wheels.

Usage: torch_cuda_stubs.py SITE_PACKAGES

PyPI's torch wheel for Linux x86_64 is a CUDA build: torch/lib/libtorch_cuda.so and friends
name libcudart.so.13, libcublas.so.13, libcudnn.so.9, libnccl.so.2, ... as DT_NEEDED, and
those come from ~2.3 GB of nvidia-* / cuda-* wheels (5.3 GB installed). The CPU tests that use
torch (tests/model/compressed_tensors_check.py) never touch CUDA, so tests/requirements-torch.txt
installs torch with --no-deps and this script writes, for each CUDA library the torch libraries
need and do not ship, a small shared library with that soname and the symbol versions torch's
libraries ask of it (readelf reads both from the installed torch/lib). Every function in them
returns 100 (cudaErrorNoDevice) and the *ErrorString / *ErrorName ones a message, so
torch.cuda.is_available() is False, and any real CUDA use fails instead of running.

They go to SITE_PACKAGES/nvidia/cu13/lib (named by the RPATH of torch's libraries, where the
real wheels put them), so `import torch` needs no environment variable. Needs gcc and readelf
(binutils; g++ of scripts/install_deps.sh brings both). Idempotent; prints what it wrote.
"""
import os
import re
import subprocess
import sys
import tempfile

site = sys.argv[1]
torch_lib = os.path.join(site, "torch", "lib")
libs = sorted(f for f in os.listdir(torch_lib) if ".so" in f)


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True,
                          check=True).stdout.splitlines()


defined, undefined, needed, rpath = set(), {}, set(), []
for f in libs:
    path = os.path.join(torch_lib, f)
    for line in readelf("-d", path):
        m = re.search(r"\((NEEDED|RPATH|RUNPATH)\).*\[(.*)\]", line)
        if m and m.group(1) == "NEEDED":
            needed.add(m.group(2))
        elif m and not rpath:
            rpath = m.group(2).split(":")
    for line in readelf("--dyn-syms", path):
        parts = line.split()
        if len(parts) < 8 or not parts[0].endswith(":"):
            continue
        name, _, version = parts[7].partition("@")
        if parts[6] == "UND":
            undefined.setdefault(name, (version.lstrip("@"), parts[3]))
        else:
            defined.add(name)

# The soname of each missing CUDA library, and the version node its symbols are asked with
# (the soname itself, but NVSHMEM for nvshmem).
stubs = {n: [] for n in needed if re.match(r"lib(cu|nv|nccl)", n) and n not in libs}
if not stubs:
    sys.exit(f"{torch_lib}: names no CUDA library it lacks (a CPU-only torch?): nothing to do")
version_of = {n: n for n in stubs}
if "libnvshmem_host.so.3" in stubs:
    version_of["libnvshmem_host.so.3"] = "NVSHMEM"
lib_of_version = {v: n for n, v in version_of.items()}
for name, (version, kind) in sorted(undefined.items()):
    if name in defined:
        continue
    if version in lib_of_version:
        stubs[lib_of_version[version]].append((name, kind))
    elif not version and re.match(r"(__)?(cu|nccl|nvshmem|nvrtc)", name):
        # Unversioned (nccl, cusparseLt, cuFile): resolved from any loaded library.
        stubs[sorted(stubs)[0]].append((name, kind))

cu_dirs = [p for p in rpath if "/nvidia/" in p]
if not cu_dirs:
    sys.exit(f"{torch_lib}: no nvidia/ directory in the RPATH of torch's libraries: {rpath}")
out = os.path.normpath(cu_dirs[-1].replace("$ORIGIN", torch_lib))
os.makedirs(out, exist_ok=True)
with tempfile.TemporaryDirectory() as tmp:
    for lib, syms in sorted(stubs.items()):
        src = [f'static const char msg[] = "no CUDA: {lib} is a stub (scripts/torch_cuda_stubs.py)";']
        for name, kind in syms:
            if kind == "OBJECT":
                src.append(f"char {name}[256];")
            elif re.search(r"Error(String|Name)$", name):
                src.append(f"const char *{name}(void) {{ return msg; }}")
            else:
                src.append(f"int {name}(void) {{ return 100; }}")
        c, vmap = os.path.join(tmp, lib + ".c"), os.path.join(tmp, lib + ".map")
        with open(c, "w") as fh:
            fh.write("\n".join(src) + "\n")
        with open(vmap, "w") as fh:
            fh.write(f"{version_of[lib]} {{ global: *; }};\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-w", "-o", os.path.join(out, lib), c,
                        f"-Wl,-soname,{lib}", f"-Wl,--version-script,{vmap}"], check=True)
print(f"torch_cuda_stubs.py: {len(stubs)} stub CUDA libraries in {out}: "
      + ", ".join(f"{lib} ({len(s)})" for lib, s in sorted(stubs.items())))
