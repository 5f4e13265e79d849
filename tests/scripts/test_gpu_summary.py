"""scripts/gpu_summary.py on synthetic logs: a racecheck run passes only when it finished, its
tests passed, every hazard its summary counts is in the log (racecheck's hazard format) and each
is the known ring-slot WAR (ldmatrix read / cp.async refill);
a gtest JSON passes only when every selected test ran and passed; `finish` exits 1 when a
check failed.

Usage: test_gpu_summary.py GPU_SUMMARY_PY
"""
import json
import os
import subprocess
import sys
import tempfile

tool = sys.argv[1]
tmp = tempfile.mkdtemp()
checks = os.path.join(tmp, "checks.jsonl")

KNOWN = """========= Error: Potential WAR hazard detected at __shared__ 0xf10 in block (72,0,0) :
=========     Read Thread (168,0,0) at sala::cuda::ldmatrix_x4(unsigned int *, const __nv_bfloat16 *)+0x5f60 in cuda_mma.cuh:49
=========     Write Thread (321,0,0) at sala::cuda::cp_async16(void *, const void *, int)+0x84f0 in cuda_mma.cuh:55
"""
RAW = """========= Error: Potential RAW hazard detected at __shared__ 0x10 in block (1,0,0) :
=========     Write Thread (3,0,0) at sala::cuda::rmsnorm_block_kernel(int)+0x10 in cuda_norm.cu:9
=========     Read Thread (40,0,0) at sala::cuda::rmsnorm_block_kernel(int)+0x20 in cuda_norm.cu:12
"""
# The stage-2 kernels' ring today (H200, session 29: --racecheck-report hazard).
KNOWN_LDSM = """========= Error: Potential WAR hazard detected at __shared__ 0x2b10 in block (35,0,0) :
=========     Read Thread (208,0,0) at sala::cuda::ldsm_x4_trans(unsigned int *, unsigned int)+0x5ea0 in cuda_mma.cuh:45
=========     Write Thread (289,0,0) at sala::cuda::cp_async16(void *, const void *, int)+0x7e00 in cuda_mma.cuh:62
"""
# racecheck's default (analysis) format names no hazard block the parser can check.
ANALYSIS = """========= Error: Race reported between Read access at sala::cuda::ldsm_x4_trans(unsigned int *, unsigned int)+0x5ea0
=========     and Write access at sala::cuda::cp_async16(void *, const void *, int)+0x7e00 [140 hazards]
"""
PASSED = "[  PASSED  ] 2 tests.\n"
SUMMARY = "========= RACECHECK SUMMARY: {} hazards displayed ({} errors, 0 warnings)\n"


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


def racecheck(name, text, rc):
    log = os.path.join(tmp, name + ".log")
    with open(log, "w") as f:
        f.write(text)
    r = run("racecheck", checks, name, log, str(rc), "3")
    assert r.returncode == 0, r.stderr
    with open(checks) as f:
        return [json.loads(l) for l in f][-1]


e = racecheck("known", KNOWN * 2 + PASSED + SUMMARY.format(2, 2), 1)
assert e["passed"] and e["details"]["known"] == 2, e
e = racecheck("clean", PASSED + SUMMARY.format(0, 0), 0)
assert e["passed"] and e["details"]["known"] == 0, e
e = racecheck("other", KNOWN + RAW + PASSED + SUMMARY.format(2, 2), 1)
assert not e["passed"] and e["details"]["other"] == 1, e
e = racecheck("cut", KNOWN + PASSED, 124)  # stopped by its timeout: no summary line
assert not e["passed"], e
e = racecheck("tests_failed", KNOWN + "[  FAILED  ] CudaOps.X\n" + SUMMARY.format(1, 1), 1)
assert not e["passed"], e
e = racecheck("known_ldsm", KNOWN_LDSM * 3 + KNOWN + PASSED + SUMMARY.format(4, 4), 1)
assert e["passed"] and e["details"]["known"] == 4, e
e = racecheck("analysis_format", ANALYSIS + PASSED + SUMMARY.format(100, 140), 1)
assert not e["passed"], e
e = racecheck("more_than_shown", KNOWN_LDSM + PASSED + SUMMARY.format(2, 2), 1)
assert not e["passed"], e
e = racecheck("print_limit", KNOWN_LDSM + PASSED + SUMMARY.format(1, 40), 1)
assert not e["passed"], e

gtest_json = os.path.join(tmp, "g.json")
with open(gtest_json, "w") as f:
    json.dump({"testsuites": [{"name": "CudaOps", "testsuite": [
        {"name": "A", "status": "RUN", "result": "COMPLETED"},
        {"name": "B", "status": "RUN", "result": "SKIPPED"}]}]}, f)
r = run("gtest", checks, "ops", gtest_json, "0", "1")
assert r.returncode == 0, r.stderr
with open(checks) as f:
    last = [json.loads(l) for l in f][-1]
assert not last["passed"], last  # a skipped test is no pass on the GPU machine

r = run("finish", checks, os.path.join(tmp, "summary.json"), "--mode", "correctness")
assert r.returncode == 1 and "SOME CHECK FAILED" in r.stdout, r.stdout
print("OK")
