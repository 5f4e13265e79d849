"""`sala score` on the bundled tiny model (the reference of tests/server/test_lm_eval.py).

Usage: score_check.py SALA_BIN MODEL_DIR

Consistency of its two answers: a score over many rows (more than one forward's 64) equals the
sum of the scores of its pieces; a greedy continuation scores as greedy (every token its row's
argmax) with a logprob <= 0, and one token changed is not greedy. Bad input lines are a clear
error (non-zero exit, the line named), never a crash."""
import json
import math
import subprocess
import sys
import tempfile

sala, model_dir = sys.argv[1:3]


def score(lines):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)
    p = subprocess.run([sala, "score", "--model-path", model_dir, "--input", f.name, "--cpu-threads", "2"],
                       capture_output=True, text=True, timeout=300)
    return p.returncode, [json.loads(x) for x in p.stdout.splitlines()], p.stderr


ids = [1] + [3 + (i * 7919) % 780 for i in range(1, 150)]
rc, out, err = score([{"ids": ids, "start": 1}, {"ids": ids[:60], "start": 1},
                      {"ids": ids[:130], "start": 60}, {"ids": ids, "start": 130},
                      {"ids": ids[:20], "generate": 12, "stop_ids": []}])
assert rc == 0, err
whole, pieces = out[0]["logprob"], sum(o["logprob"] for o in out[1:4])
assert whole < 0 and math.isclose(whole, pieces, rel_tol=1e-6), (whole, pieces)
gen = out[4]["output_ids"]
assert len(gen) == 12, gen
rc, out, err = score([{"ids": ids[:20] + gen, "start": 20},
                      {"ids": ids[:20] + gen[:5] + [(gen[5] + 1) % 780 + 3] + gen[6:], "start": 20}])
assert rc == 0, err
assert out[0]["greedy"] is True and out[0]["logprob"] <= 0, out[0]
assert out[1]["greedy"] is False and out[1]["logprob"] < out[0]["logprob"], out
for line, message in (({"ids": [1, 2], "start": "x"}, "'start' must be an integer"),
                      ({"ids": [], "generate": 3}, "0 ids"),
                      ({"ids": [1, 2], "start": 2}, "start 2 outside 1..1"),
                      ({"ids": [1, 99999], "start": 1}, "outside the vocabulary"),
                      ({"ids": [1, 2]}, "give 'start' (score) or 'generate'")):
    rc, _, err = score([line])
    assert rc != 0 and message in err, (line, rc, err)
print("score_check: ok", whole, pieces)
