#!/usr/bin/env python3
"""The table of bench/gpu/int8s_sweep.sh: from its `bench decode` JSONs, per
split size and depth, the bf16 step and, per tc launch configuration, the
int8s and hybrid steps (median ms/step, resident), their ratio to bf16, and
the rate the int8s step reads its pages at (history bytes / median device
time of the whole step: 16 layers of kernel + merge + launch gaps, so a lower
bound on the kernel's own rate). '*' marks the fastest int8s configuration.

    bench/gpu/int8s_sweep_table.py OUT/int8s_sweep_*.json
"""
import json
import sys
from collections import defaultdict


def main(paths):
    rows = defaultdict(dict)  # (split, depth) -> {(format, config, serial): record}
    for p in paths:
        d = json.load(open(p))
        split = d["shape"]["split_tokens"]
        serial = not d["shape"].get("overlap_formats", True)
        for r in d["records"]:
            if r["mode"] != "resident" or r["batch"] != 1:
                continue
            rows[(split, r["context"])][(r["format"], r.get("tc_config", ""), serial)] = r
    print("resident step, batch 1, median of the measured steps; GB/s = history bytes / device ms of the step")
    print(f"{'split':>5} {'depth':>7} {'config':>8} | {'int8s ms':>8} {'x bf16':>6} {'GB/s':>6} | "
          f"{'hybrid ms':>9} {'x bf16':>6} | notes")
    for (split, depth) in sorted(rows):
        recs = rows[(split, depth)]
        bf = recs.get(("bf16", "", False))
        bf_ms = bf["step_ms"] if bf else float("nan")
        print(f"{split:>5} {depth:>7} {'bf16':>8} | {bf_ms:8.3f} {1.0:6.2f} "
              f"{(bf['history_bytes'] / (bf['device_ms'] * 1e6)) if bf else float('nan'):6.0f} |")
        configs = sorted({c for (f, c, s) in recs if f == "int8s" and not s})
        best = min(configs, key=lambda c: recs[("int8s", c, False)]["step_ms"]) if configs else None
        for c in configs:
            i8 = recs[("int8s", c, False)]
            hy = recs.get(("hybrid", c, False))
            notes = []
            for r in (i8, hy):
                if r and not r["repeatable"]:
                    notes.append(f"{r['format']} NOT REPEATABLE")
            hy_s = f"{hy['step_ms']:9.3f} {hy['step_ms'] / bf_ms:6.2f}" if hy else f"{'-':>9} {'-':>6}"
            print(f"{split:>5} {depth:>7} {c:>8} | {i8['step_ms']:8.3f} {i8['step_ms'] / bf_ms:6.2f} "
                  f"{i8['history_bytes'] / (i8['device_ms'] * 1e6):6.0f} | {hy_s} | {'* ' if c == best else ''}"
                  f"{', '.join(notes)}")
        for (f, c, s), r in sorted(recs.items()):
            if s:
                print(f"{split:>5} {depth:>7} {c:>8} | {'':>8} {'':>6} {'':>6} | {r['step_ms']:9.3f} "
                      f"{r['step_ms'] / bf_ms:6.2f} | hybrid, kernels serialised (--serial-formats)")
    print("targets (issue 13): int8s x bf16 <= 0.6; int8s >= 3000 GB/s at 128K; hybrid <= 1.8 ms at 128K")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: int8s_sweep_table.py SWEEP.json...")
    main(sys.argv[1:])
