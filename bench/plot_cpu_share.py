#!/usr/bin/env python3
"""Plot co-attention from `activekv bench decode --cpu-share ... --json`:
decode step time vs the share of pages the host CPU attends, one panel per
depth, one colour per kv format and mode; measured (solid, markers) and, where
the run calibrated the planner (`auto` in --cpu-share), its prediction
(dashed). The planner's own choice is a star.

usage: plot_cpu_share.py bench_decode.json [-o cpu_share.png]
"""
import argparse
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("-o", "--out", default="cpu_share.png")
    a = ap.parse_args()
    d = json.load(open(a.input))
    recs = [r for r in d["records"] if r["mode"] != "resident"]
    if not recs:
        raise SystemExit(f"{a.input}: no streamed records to plot")
    depths = sorted({r["context"] for r in recs})
    fig, axes = plt.subplots(1, len(depths), figsize=(6 * len(depths), 4.5), squeeze=False)
    for ax, depth in zip(axes[0], depths):
        series = sorted({(r["format"], r["mode"]) for r in recs if r["context"] == depth})
        for i, (fmt, mode) in enumerate(series):
            colour = f"C{i}"
            rows = [r for r in recs if r["context"] == depth and (r["format"], r["mode"]) == (fmt, mode)]
            fixed = sorted((r for r in rows if not r.get("cpu_share_auto")), key=lambda r: r["cpu_share"])
            ax.plot([100 * r["cpu_share"] for r in fixed], [r["step_ms"] for r in fixed], "o-", color=colour,
                    label=f"{fmt} {mode} measured")
            if any(r.get("cpu_share_auto") for r in rows):  # the run calibrated: every row has the planner's price
                pred = fixed
                ax.plot([100 * r["cpu_share"] for r in pred], [r["predicted_ms"] for r in pred], "--", color=colour,
                        label=f"{fmt} {mode} predicted")
            for r in rows:
                if r.get("cpu_share_auto"):
                    ax.plot([100 * r["cpu_share"]], [r["step_ms"]], "*", color=colour, markersize=14,
                            label=f"{fmt} {mode} planner's choice")
                    ax.plot([100 * r["cpu_share"]], [r["planned_ms"]], "*", color=colour, markersize=14,
                            fillstyle="none", label=f"{fmt} {mode} planner's prediction")
        ax.set_title(f"depth {depth // 1024}K")
        ax.set_xlabel("pages attended by the host CPU (%)")
        ax.set_ylabel("decode step, attention only (ms)")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.suptitle(f"co-attention, {d['device']}, commit {d['commit'][:10]}", fontsize=10)
    # The PNG carries its provenance, visibly and in its text chunks: the bench
    # command and commit behind it, and this plot's command.
    source = f"{d.get('command', '?')} (commit {d.get('commit', '?')})"
    plot_cmd = "bench/plot_cpu_share.py " + " ".join(sys.argv[1:])
    fig.text(0.01, 0.005, textwrap.fill("data: " + source, 180) + "\nplot: " + plot_cmd, fontsize=5, va="bottom")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    meta = {"Source": source, "Description": source, "Comment": "command: " + source, "Software": plot_cmd}
    fig.savefig(a.out, dpi=110, metadata=meta)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
