#!/usr/bin/env python3
"""Where a decode step's GPU time goes, kernel by kernel, resident KV against the host tier.

Reads the CSV that `ncu --metrics gpu__time_duration.sum --csv --page raw` writes for a bench_model run (the
`tierprofile` stage of scripts/gpu/cuda.sh: resident first, then tiered, in one process). Nsight Compute serialises
every kernel, graph nodes included, so the sums are the kernels' own time without overlap or launch gaps.

A step starts at each `--step-start` kernel (the token embedding); the kernels before the first one (the cache fill)
are dropped. A step holding a `--tier-mark` kernel belongs to a tiered run. For each run the last `--last` steps are
averaged, and the table lists every kernel name with its time per step in both runs and the difference.

    tools/ncu_steps.py tier-ncu.csv [--last 2] [--top 40]
"""
import argparse
import csv
import re
import sys
from collections import defaultdict

UNIT_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def short_name(name):
    """`void foo_kernel<...>(args)` -> `foo_kernel<...>` without the argument list or return type."""
    name = re.sub(r"\(.*\)$", "", name.strip())
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == " " and depth == 0:
            cut = i
    if cut < len(name):
        name = name[cut + 1 :]
    return name[:90]


def read_kernels(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{path}: no CSV rows")
    header = rows[0]
    try:
        i_name, i_dur = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    except ValueError:
        sys.exit(f"{path}: no 'Kernel Name' / 'gpu__time_duration.sum' columns in {header}")
    body = rows[1:]
    scale = 1.0
    if body and not re.match(r"^[\d.,]+$", body[0][i_dur] or "x"):  # the units row
        scale = UNIT_NS.get(body[0][i_dur].strip(), 1.0)
        body = body[1:]
    out = []
    for r in body:
        if len(r) <= max(i_name, i_dur):
            continue
        try:
            out.append((short_name(r[i_name]), float(r[i_dur].replace(",", "")) * scale))
        except ValueError:
            continue
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--step-start", default="embedding_kernel")
    ap.add_argument("--tier-mark", default="kv_split_kernel")
    ap.add_argument("--last", type=int, default=2, help="steps averaged at the end of each run")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()

    kernels = read_kernels(a.csv)
    steps, cur = [], None
    for name, ns in kernels:
        if a.step_start in name:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((name, ns))
    if not steps:
        sys.exit(f"no '{a.step_start}' kernel in {len(kernels)} kernels")
    runs = []  # consecutive steps of one kind: (tiered, [steps])
    for s in steps:
        tiered = any(a.tier_mark in n for n, _ in s)
        if not runs or runs[-1][0] != tiered:
            runs.append((tiered, []))
        runs[-1][1].append(s)
    print(f"{len(kernels)} kernels, {len(steps)} steps: " +
          ", ".join(f"{'tiered' if t else 'resident'} x{len(ss)}" for t, ss in runs))

    def per_step(ss):
        ss = ss[-a.last :]
        tot, cnt = defaultdict(float), defaultdict(float)
        for s in ss:
            for n, ns in s:
                tot[n] += ns / len(ss)
                cnt[n] += 1 / len(ss)
        return tot, cnt

    res = next((ss for t, ss in reversed(runs) if not t), None)
    tie = next((ss for t, ss in reversed(runs) if t), None)
    if res is None or tie is None:
        for t, ss in runs:
            tot, _ = per_step(ss)
            print(f"{'tiered' if t else 'resident'}: {sum(tot.values()) / 1e3:.1f} us per step")
        return
    rt, rc = per_step(res)
    tt, tc = per_step(tie)
    names = sorted(set(rt) | set(tt), key=lambda n: -abs(tt.get(n, 0) - rt.get(n, 0)))
    print(f"per step (last {a.last}): resident {sum(rt.values()) / 1e3:.1f} us, tiered {sum(tt.values()) / 1e3:.1f} us, "
          f"difference {(sum(tt.values()) - sum(rt.values())) / 1e3:+.1f} us")
    print(f"{'kernel':<90} {'res us':>8} {'n':>5} {'tier us':>8} {'n':>5} {'diff us':>8}")
    for n in names[: a.top]:
        print(f"{n:<90} {rt.get(n, 0) / 1e3:8.1f} {rc.get(n, 0):5.0f} {tt.get(n, 0) / 1e3:8.1f} {tc.get(n, 0):5.0f} "
              f"{(tt.get(n, 0) - rt.get(n, 0)) / 1e3:+8.1f}")


if __name__ == "__main__":
    main()
