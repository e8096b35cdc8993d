#!/usr/bin/env python3
"""Plot `bench decode` results: step latency vs context (depth), one panel per
batch size, one line per kv-format/mode and peer, plus each streamed format's
bus limit (its bytes / B, dashed).

usage: plot_decode.py bench_decode.json [peers.json] -o decode.png
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def r_fmt(name):
    return name.split("-")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("-o", "--out", default="decode.png")
    a = ap.parse_args()
    recs, device, commit = [], "", ""
    for path in a.inputs:
        d = json.load(open(path))
        recs += d["records"]
        device = device or d.get("device", "")
        commit = commit or d.get("commit", "")
    batches = sorted({r["batch"] for r in recs})
    fig, axes = plt.subplots(1, len(batches), figsize=(9 * len(batches), 5.5), squeeze=False)
    for ax, b in zip(axes[0], batches):
        rs = [r for r in recs if r["batch"] == b]
        ax.set_prop_cycle(color=plt.cm.tab20.colors)
        def label(r):
            return r["format"] + ("-" + r["mode"] if r.get("mode") else "")
        for name in sorted({label(r) for r in rs}):
            pts = sorted((r["context"], r["step_ms"]) for r in rs if label(r) == name)
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)[0]
            bus = sorted((r["context"], r["bus_limit_ms"]) for r in rs
                         if label(r) == name and r.get("mode") == "streamed")
            if bus:
                ax.plot([p[0] for p in bus], [p[1] for p in bus], "--", color=line.get_color(), alpha=0.6,
                        label=f"bus limit ({r_fmt(name)} bytes / B)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth (context tokens)")
        ax.set_ylabel("step latency, ms (16 layers of attention)")
        ax.set_title(f"batch {b}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"ActiveKV decode attention, 27B shape, {device} (commit {commit})")
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"plot written to {a.out}")


if __name__ == "__main__":
    main()
