#!/usr/bin/env python3
"""scripts/ktrace/ktrace_summary.py on a synthetic trace: two launches of one recorded graph
(kernels overlapping as under PDL, one gap) and a kernel outside any graph. Checks the span,
the idle time, each kernel's mean frontier push and the timeline's offsets."""
import subprocess
import sys
import tempfile

HEAD = ("start_ns,end_ns,graph_id,graph_node_id,correlation_id,stream,grid,block,registers,"
        "dyn_smem,name\n")
# Per launch (offsets in ns): gemv 0-4000; norm 3000-7000 (starts early, pushes 3000);
# quantize 8000-9000 (a 1000 ns gap, pushes 1000). Span 9000, idle 1000.
ROWS = []
for corr, t0 in ((10, 100000), (20, 200000)):
    ROWS.append(f"{t0},{t0 + 4000},3,1,{corr},7,132x1x1,256x1x1,100,0,gemv_kernel")
    ROWS.append(f"{t0 + 3000},{t0 + 7000},3,2,{corr},7,1x1x1,512x1x1,32,0,norm, with comma")
    ROWS.append(f"{t0 + 8000},{t0 + 9000},3,3,{corr},7,1x1x1,512x1x1,32,0,quantize")
ROWS.append("500000,600000,0,0,99,7,1x1x1,32x1x1,8,0,eager_kernel")


def main() -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(HEAD + "\n".join(ROWS) + "\n")
    out = subprocess.run([sys.executable, sys.argv[1], f.name, "--min-kernels", "1",
                          "--timeline"], capture_output=True, text=True, check=True).stdout
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith("graph 3: 2 launches, 3 kernels each, span 9.0 us"), lines[0]
    assert "idle 1.0 us" in lines[0], lines[0]
    pushes = {ln.split()[-2]: ln.split() for ln in lines[2:5]}
    assert pushes["gemv_kernel"][2] == "4.0", pushes  # front us
    assert lines[2].split()[-2] == "gemv_kernel"  # sorted by frontier push
    norm = next(ln for ln in lines[2:5] if "norm, with comma" in ln).split()
    assert norm[1] == "4.0" and norm[2] == "3.0", norm  # duration 4, push 3
    quant = pushes["quantize"]
    assert quant[2] == "1.0", quant
    assert "eager_kernel" not in out  # kernels outside graphs are not steps
    tl = [ln.split() for ln in lines if ln.strip().startswith(("0.00", "3.00", "8.00"))]
    assert [t[0] for t in tl] == ["0.00", "3.00", "8.00"], tl
    assert [t[2] for t in tl] == ["0.00", "-1.00", "1.00"], tl  # start minus the frontier
    print("ok")


if __name__ == "__main__":
    main()
