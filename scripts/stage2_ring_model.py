#!/usr/bin/env python3
"""A rough host model of the wgmma stage-2 kernel's ring (cuda_infllm_attn_sm90.cu), session 28.

Not a measurement: it asks how much the ring couples the consumer warps. One block = 8 rows
(2 warpgroups of 4) walking the union of their selected 64-key tiles in order through a ring
of `slots` slots; a slot is refilled only when all 8 warps released its tile. A tile all 4
rows of a warpgroup selected costs the warpgroup Cg cycles together (wgmma); any other costs
each selecting warp Cw cycles alone (warp_tile). Selections: 34 forced tiles per row (block 0
and the 33-block window) plus 62 drawn from a 128K context, a share p of them from blocks the
8 rows share. Loads are free (the "loads off" probe). Prints the block's time for 4 / 5 / 8 /
unbounded slots against the warps' own serial work.
"""
import random


def make_rows(p, qb=1600, forced=34, sel=62, rows=8, rng=None):
    allb = [b for b in range(1, qb-32)]
    common = rng.sample(allb, sel)
    out = []
    for r in range(rows):
        s = set([0] + list(range(qb-32, qb+1)))
        pool = list(common); rng.shuffle(pool)
        while len(s) < forced + sel:
            if rng.random() < p and pool: s.add(pool.pop())
            else: s.add(rng.choice(allb))
        out.append(s)
    return out


def run(rows, slots, Cw, Cg, L, thr=3):
    """Block time in cycles; L: load latency per tile; thr: most users a warp_tile tile has."""
    union = sorted(set().union(*rows))
    n = len(union)
    users = [[r for r in range(8) if union[i] in rows[r]] for i in range(n)]
    # state
    full = [None]*n          # time tile i is loaded
    release = [None]*n       # time all 8 warps released tile i
    passed = [[None]*n for _ in range(8)]  # time warp r releases tile i
    t_warp = [0.0]*8
    for i in range(n):
        # producer: slot of tile i frees when tile i-slots released
        start = 0.0 if i < slots else release[i-slots]
        full[i] = start + L
        gusers = [[r for r in users[i] if r//4 == g] for g in range(2)]
        for g in range(2):
            gu = gusers[g]
            ws = range(4*g, 4*g+4)
            if len(gu) > thr:
                t0 = max(max(t_warp[r] for r in ws), full[i])
                for r in ws: t_warp[r] = t0 + Cg
            else:
                for r in ws:
                    t0 = max(t_warp[r], full[i])
                    t_warp[r] = t0 + (Cw if r in gu else 0)
        for r in range(8): passed[r][i] = t_warp[r]
        release[i] = max(passed[r][i] for r in range(8))
    return max(t_warp), n, sum(len(u) for u in users)


rng = random.Random(1)
for p in (0.5, 0.7):
    rows = make_rows(p, rng=rng)
    for Cw in (1200, 2500, 4000):
        res = []
        for slots in (4, 5, 8, 10**6):
            T, n, uses = run(rows, slots, Cw, 1600, 0)
            res.append(T)
        ideal = Cw * 62 + 1600*34   # per-warp serial work, no coupling
        print(f"p={p} union={n} uses={uses} Cw={Cw}: slots 4/5/8/inf -> " + " / ".join(f"{x/1e3:.0f}K" for x in res) + f"  (per-warp work {ideal/1e3:.0f}K)")
