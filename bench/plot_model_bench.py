#!/usr/bin/env python3
"""Plot `activekv bench -o json` results: decode ms/token vs depth, one line
per kv format and placement (solid, markers), its floor (weight bytes / HBM
read + history bytes / the history link, both measured in the run; dashed, same
colour), and llama.cpp's figures from SPEC section 1 where the JSON has them
(black, dotted, per cache type and placement). Log-scaled y: the streamed and
resident rows differ by two orders of magnitude.

usage: plot_model_bench.py bench.json [more.json ...] [-o model_bench.png]
(an input FILE.json:a.b is the object at keys a, b inside FILE.json, e.g. one
run of an A/B file; several files of one model, e.g. depths run in separate calls: their rows are joined;
a later file's row replaces an earlier one of the same format, placement, host CPU share and depth)
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(spec):
    """FILE.json, or FILE.json:a.b -- the object at keys a, b inside it."""
    path, _, keys = spec.partition(".json:")
    path = path if not keys else path + ".json"
    obj = json.load(open(path))
    for k in keys.split(".") if keys else []:
        if k not in obj:
            raise SystemExit(f"{spec}: no key '{k}' (has {', '.join(obj)})")
        obj = obj[k]
    return obj


def where(r):
    """The row's placement, with its host CPU share (co-attention) when it had one."""
    share = r.get("cpu_share")
    if share in (None, 0, 0.0):
        return r["kv_placement"]
    return f"{r['kv_placement']}+cpu {share if share == 'auto' else f'{100 * share:.0f}%'}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("-o", "--out", default="model_bench.png")
    a = ap.parse_args()
    runs = [load(p) for p in a.inputs]
    d = runs[0]
    latest = {}
    for run in runs:
        for r in run["rows"]:
            if r["kind"] == "tg":
                latest[(r["kv_format"], where(r), r["depth"])] = r
    tg = list(latest.values())
    if not tg:
        raise SystemExit(f"{', '.join(a.inputs)}: no decode (tg) rows to plot")
    fig, ax = plt.subplots(figsize=(10, 6))
    colors = plt.cm.tab10.colors
    series = sorted({(r["kv_format"], where(r)) for r in tg})
    for i, (fmt, pl) in enumerate(series):
        rs = sorted((r for r in tg if (r["kv_format"], where(r)) == (fmt, pl)), key=lambda r: r["depth"])
        x = [r["depth"] for r in rs]
        c = colors[i % len(colors)]
        ax.plot(x, [r["ms_per_token"] for r in rs], "o-", color=c, label=f"ActiveKV {fmt}, {pl}")
        fl = [(r["depth"], r["floor_ms"]) for r in rs if r["floor_ms"]]
        if fl:
            ax.plot(*zip(*fl), "--", color=c, alpha=0.7, label=f"floor {fmt}, {pl}")
    refs = {}
    for r in tg:
        if r.get("llama_cpp_ms"):
            refs.setdefault((r["llama_cpp_cache"], r["kv_placement"]), set()).add((r["depth"], r["llama_cpp_ms"]))
    for (cache, pl), pts in sorted(refs.items()):
        ax.plot(*zip(*sorted(pts)), "k:", marker="x", label=f"llama.cpp {cache} ({pl}; SPEC §1)")
    ax.set_yscale("log")
    ax.set_xlabel("depth (history tokens before the decode steps)")
    ax.set_ylabel("ms / token (decode)")
    m = d["model"]
    ax.set_title(f"activekv bench: {m['n_layers']} layers, hidden {m['d_model']}, {m['n_heads']}/{m['n_kv_heads']} heads "
                 f"x {m['head_dim']}, {m['params'] / 1e9:.2f}B params\n{d['device']} | commit "
                 f"{', '.join(sorted({run['commit'][:12] for run in runs}))}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    # The command, in the PNG's own text chunk: the file says how it was made.
    import shlex, sys  # noqa: E401
    fig.savefig(a.out, dpi=120,
                metadata={"Description": "python3 bench/plot_model_bench.py " + " ".join(map(shlex.quote, sys.argv[1:]))})
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
