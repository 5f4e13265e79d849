"""Runs SGLang's own `sglang.bench_serving` (the installed PyPI package's code, unchanged)
without its GPU dependencies.

`python -m sglang.bench_serving` first executes sglang/__init__.py, which imports
sglang.srt.utils.common -> torch, triton, PIL, ... (the whole GPU server runtime). The bench
client itself needs none of that: sglang/benchmark/serving.py only uses aiohttp, requests,
numpy, transformers (tokenizer), msgspec/orjson, and two names from sglang.srt
(FAKE_BOOTSTRAP_HOST, a string constant, from sglang.srt.disaggregation.utils which imports
torch; resolve_base_url/resolve_host_port from sglang.srt.utils.network, pure Python). So we
register `sglang`, `sglang.srt`, `sglang.srt.utils` and `sglang.srt.disaggregation` as bare
packages pointing at the installed directories (their __init__ files are skipped), give
sglang.srt.disaggregation.utils its one constant (read from the installed file), and run
sglang.benchmark.serving's real cli_main with the command-line arguments given to us.
"""
import importlib.util
import os
import re
import sys
import types


def bare_package(name, path):
    m = types.ModuleType(name)
    m.__path__ = [path]
    m.__package__ = name
    sys.modules[name] = m
    return m


def main():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("sglang is not installed in this interpreter (pip install --no-deps sglang)")
    root = list(spec.submodule_search_locations)[0]
    bare_package("sglang", root)
    bare_package("sglang.srt", os.path.join(root, "srt"))
    bare_package("sglang.srt.utils", os.path.join(root, "srt", "utils"))
    bare_package("sglang.srt.disaggregation", os.path.join(root, "srt", "disaggregation"))
    src = open(os.path.join(root, "srt", "disaggregation", "utils.py")).read()
    m = re.search(r'^FAKE_BOOTSTRAP_HOST\s*=\s*(.+)$', src, re.M)
    dis = types.ModuleType("sglang.srt.disaggregation.utils")
    dis.FAKE_BOOTSTRAP_HOST = eval(m.group(1)) if m else "2.2.2.2"
    sys.modules["sglang.srt.disaggregation.utils"] = dis
    from sglang.benchmark import serving  # the real bench client

    sys.argv = ["sglang.bench_serving"] + sys.argv[1:]
    serving.cli_main() if hasattr(serving, "cli_main") else serving.main()


if __name__ == "__main__":
    main()
