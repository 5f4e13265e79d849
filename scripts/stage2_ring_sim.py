#!/usr/bin/env python3
"""Deadlock check of a stage-2 K/V ring protocol before it costs GPU time.

The InfLLM-v2 stage-2 kernels hand 64-key tiles from producers to consumer groups through a
ring of `slots` shared-memory slots (full / empty mbarriers). Session 24's first lookahead
version deadlocked on the H200 (docs/PERF_LOG.md, session 24, command 3): a consumer holding
tile `cur` waited for a tile the producer could hand over only after refilling `cur`'s slot.
This models the protocol (not the kernel's code) and runs it on random selections:

  producer  issues tile i once every group released tile i - slots, and hands tile i over
            after it issued tile i + lag (cp.async with kInFlight tiles in flight: lag =
            kInFlight - 1; TMA: lag 0), or at the end;
  consumers each group walks the list in order; a tile it does not need is waited for and
            released at once; `reach` > 1: while holding `cur` it may wait for the next tile
            it needs if that is before cur + reach (the S-ahead variant), else it releases
            `cur` first.

Usage: stage2_ring_sim.py SLOTS LAG REACH [TRIALS]; exit status 1 on a deadlock. Examples:
  stage2_ring_sim.py 4 2 4    # session 24 command 3: deadlocks
  stage2_ring_sim.py 5 1 4    # command 4: no deadlock
  stage2_ring_sim.py 4 0 4    # TMA with S ahead up to the ring: no deadlock
"""
import random
import sys


def run(slots, lag, reach, need):
    n, groups = len(need), len(need[0])
    released = [[False] * n for _ in range(groups)]
    handed = 0  # tiles 0 .. handed - 1 are full
    issued = 0
    # per group: the tile it holds (None: none), the next list entry it looks at, done
    state = [{"cur": None, "i": 0, "done": False} for _ in range(groups)]

    def full(i):
        return i < handed

    def step_group(g):
        """Advances group g by one action if it can; returns True if it did."""
        st = state[g]
        if st["done"]:
            return False
        cur, i = st["cur"], st["i"]
        if cur is None:  # holding nothing: walk to the next tile it needs
            if i >= n:
                st["done"] = True
                return True
            if not full(i):
                return False
            if need[i][g]:
                st["cur"], st["i"] = i, i + 1
            else:
                released[g][i] = True
                st["i"] = i + 1
            return True
        # holding cur: look ahead within reach, else finish cur
        if reach > 1 and i < min(n, cur + reach):
            if not full(i):
                return False
            if need[i][g]:  # S of tile i issued ahead; cur is done after it
                released[g][cur] = True
                st["cur"], st["i"] = i, i + 1
            else:
                released[g][i] = True
                st["i"] = i + 1
            return True
        released[g][cur] = True
        st["cur"] = None
        return True

    while True:
        moved = False
        # producer
        if issued < n and (issued < slots or all(released[g][issued - slots] for g in range(groups))):
            issued += 1
            moved = True
        target = n if issued == n else max(0, issued - lag)
        if handed < target:
            handed = target
            moved = True
        for g in range(groups):
            moved |= step_group(g)
        if all(st["done"] for st in state):
            return True
        if not moved:
            return False


def main():
    slots, lag, reach = (int(a) for a in sys.argv[1:4])
    trials = int(sys.argv[4]) if len(sys.argv) > 4 else 2000
    rng = random.Random(1)
    for t in range(trials):
        n = rng.randint(1, 60)
        density = rng.choice([0.1, 0.3, 0.6, 1.0])
        need = [[rng.random() < density for _ in range(2)] for _ in range(n)]
        for row in need:  # every tile of the union is needed by some group
            if not any(row):
                row[rng.randrange(2)] = True
        if not run(slots, lag, reach, need):
            print(f"deadlock: slots {slots}, lag {lag}, reach {reach}, trial {t}, n {n}")
            return 1
    print(f"no deadlock in {trials} trials: slots {slots}, lag {lag}, reach {reach}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
