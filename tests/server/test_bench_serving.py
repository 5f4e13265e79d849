"""SGLang's own bench client (`sglang.bench_serving --backend sglang --dataset-name custom`,
the code of the installed PyPI package, run through run_sglang_bench.py without its GPU
dependencies) against `sala serve`, at --max-concurrency 1, 8 and unbounded, on a small
JSONL converted from the toolkit's format ({"question", "model_response"})."""
import json
import os
import re
import subprocess
import sys
import tempfile

from common import HERE, Check, Server, log

TOOLKIT_ROWS = [
    {"question": "What is 426+750?", "model_response": "1176 " * 6},
    {"question": "What is 845+822?", "model_response": "The sum is 1667, computed digit by digit."},
    {"question": "Tell me about copper lanterns.", "model_response": "copper lantern " * 10},
    {"prompt": "summit orbit prism " * 40, "model_response": "orbit prism sparrow thunder " * 5},
    {"input": "Hello", "model_response": "Hello there, how are you today?"},
    {"question": "What is 1+2?", "model_response": "3, because one plus two is three."},
    {"question": "garden " * 90, "model_response": "velvet tide prism garden " * 4},
    {"question": "What is 30+40?", "model_response": "70 is the answer to this question."},
]


def to_bench_jsonl(rows, path):
    """The toolkit's question/input/prompt + model_response rows -> the custom dataset's
    conversations format that sglang.bench_serving reads."""
    with open(path, "w") as f:
        for r in rows:
            q = r.get("question", r.get("input", r.get("prompt")))
            f.write(json.dumps({"conversations": [{"role": "user", "content": q},
                                                  {"role": "assistant", "content": r["model_response"]}]}) + "\n")


def main():
    ck = Check("bench_serving")
    try:
        import sglang  # noqa: F401  (only to fail loudly when missing)
    except Exception:
        pass
    tmp = tempfile.mkdtemp()
    data = os.path.join(tmp, "bench.jsonl")
    to_bench_jsonl(TOOLKIT_ROWS * 2, data)
    with Server() as s:
        for conc in ("1", "8", None):
            out_file = os.path.join(tmp, f"result-{conc}.jsonl")
            cmd = [sys.executable, os.path.join(HERE, "run_sglang_bench.py"), "--backend", "sglang",
                   "--dataset-name", "custom", "--dataset-path", data, "--num-prompts", str(len(TOOLKIT_ROWS) * 2),
                   "--host", s.host, "--port", str(s.port), "--output-file", out_file, "--seed", "1"]
            if conc:
                cmd += ["--max-concurrency", conc]
            log("running:", " ".join(cmd))
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            text = p.stdout + p.stderr
            tail = "\n".join(l for l in text.splitlines() if not l.startswith("[transformers]"))[-3000:]
            ck(p.returncode == 0, f"bench exited {p.returncode}:\n{tail}")
            m = re.search(r"Successful requests:\s+(\d+)", text)
            d = re.search(r"Benchmark duration \(s\):\s+([\d.]+)", text)
            o = re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", text)
            ck(m and int(m.group(1)) == len(TOOLKIT_ROWS) * 2, f"concurrency {conc}: successful requests {m and m.group(1)}\n{tail}")
            log(f"bench_serving max-concurrency {conc or 'unbounded'}: duration {d and d.group(1)} s, "
                f"output {o and o.group(1)} tok/s, successful {m and m.group(1)}")
            if os.path.exists(out_file):
                res = json.loads(open(out_file).read().splitlines()[-1])
                ck(res.get("completed") == len(TOOLKIT_ROWS) * 2, f"result file completed={res.get('completed')}")
                ck(res.get("total_output_tokens", 0) > 0, "output tokens counted")
        s.wait_idle()
    ck.done()


if __name__ == "__main__":
    main()
