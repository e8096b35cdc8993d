#!/usr/bin/env python3
"""Peers for `bench decode`, measured with PyTorch on the same GPU and shape.

  sdpa-resident        history resident in GPU memory, one
                       F.scaled_dot_product_attention per layer with
                       enable_gqa=True (q [B, Hq, 1, D], k/v [B, Hkv, T, D]).
  sdpa-resident-grouped the same attention with the GQA group folded into the
                       query length (q [B, Hkv, group, D]): identical maths for
                       decode (no mask), lets the fused kernels run without
                       expanding K/V. Reported as a second SDPA line.
  naive-offload-sdpa   history in pinned host memory; per layer copy the whole
                       K and V to the GPU, then SDPA (same stream, no overlap):
                       what "offload" does without a streaming engine.

Same record fields as `activekv bench decode` (format, context, batch, step_ms,
step_ms_min, step_ms_max, bytes_per_step, gbps, bus_limit_ms, bus_limit_ratio,
predicted_ms (null: no model for peers), device, commit, command). The bus
limit uses B from the profile JSON written by the C++ bench (same run), at the
copy size each peer uses.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def parse_sizes(s):
    out = []
    for item in s.split(","):
        item = item.strip()
        if not item:
            continue
        mult = 1024 if item[-1] in "kK" else 1
        out.append(int(item.rstrip("kK")) * mult)
    return out


def bandwidth_gbps(profile, nbytes):
    xs, ys = profile["h2d_copy_bytes"], profile["h2d_gbps"]
    if nbytes <= xs[0]:
        return ys[0]
    if nbytes >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if nbytes <= xs[i]:
            t = (math.log(nbytes) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def time_steps(fn, steps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), min(ms), max(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="32k,64k,128k")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--q-heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", default="profile.json")
    ap.add_argument("--json", default="peers.json")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--peers", default="sdpa-resident,sdpa-resident-grouped,naive-offload-sdpa")
    a = ap.parse_args()
    command = " ".join(["python3"] + sys.argv)
    ctxs, batches = parse_sizes(a.contexts), [int(b) for b in a.batches.split(",")]
    peers = a.peers.split(",")
    L, Hkv, Hq, D = a.layers, a.kv_heads, a.q_heads, a.head_dim
    G = Hq // Hkv
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name(0)
    try:
        profile = json.load(open(a.profile))
    except OSError:
        profile = None
    print(f"peers: {name}, torch {torch.__version__}, {L} layers, {Hkv}x{D} KV, {Hq} q heads", flush=True)
    records = []

    def record(fmt, ctx, b, med, mn, mx, bytes_moved, chunk, extra=None):
        hist = ctx * b * L * 2 * Hkv * D * 2
        B = bandwidth_gbps(profile, chunk) if profile else float("nan")
        bus = hist / (B * 1e6)
        r = dict(format=fmt, context=ctx, depth=ctx, batch=b, step_ms=med, step_ms_min=mn, step_ms_max=mx,
                 steps=a.steps, t_per_s=b * 1000.0 / med, bytes_per_step=bytes_moved,
                 gbps=hist / (med * 1e6), chunk_gbps=B, bus_limit_ms=bus, bus_limit_ratio=med / bus,
                 predicted_ms=None, device=name, commit=a.commit, command=command)
        if extra:
            r.update(extra)
        records.append(r)
        print(f"  {fmt:24s} depth {ctx:7d} batch {b}: {med:9.3f} ms (min {mn:.3f} max {mx:.3f}) "
              f"{r['gbps']:8.1f} GB/s  ratio to bus limit {r['bus_limit_ratio']:.3f}", flush=True)

    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    for b in batches:
        for ctx in ctxs:
            q = torch.randn(L, b, Hq, 1, D, device=dev, dtype=torch.bfloat16, generator=gen)
            if "sdpa-resident" in peers or "sdpa-resident-grouped" in peers:
                k = torch.rand(L, b, Hkv, ctx, D, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1
                v = torch.rand(L, b, Hkv, ctx, D, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1
                if "sdpa-resident" in peers:
                    def step():
                        for l in range(L):
                            F.scaled_dot_product_attention(q[l], k[l], v[l], enable_gqa=True)
                    try:
                        med, mn, mx = time_steps(step, a.steps, a.warmup)
                        record("sdpa-resident", ctx, b, med, mn, mx, 0, 32 << 20,
                               dict(per_layer_ms=med / L))
                    except RuntimeError as e:
                        print(f"  sdpa-resident depth {ctx} batch {b}: failed: {e}", flush=True)
                if "sdpa-resident-grouped" in peers:
                    qg = q.view(L, b, Hkv, G, D)

                    def step_g():
                        for l in range(L):
                            F.scaled_dot_product_attention(qg[l], k[l], v[l])
                    med, mn, mx = time_steps(step_g, a.steps, a.warmup)
                    record("sdpa-resident-grouped", ctx, b, med, mn, mx, 0, 32 << 20, dict(per_layer_ms=med / L))
                    # correctness cross-check of the two SDPA forms on layer 0
                    if "sdpa-resident" in peers:
                        o1 = F.scaled_dot_product_attention(q[0], k[0], v[0], enable_gqa=True)
                        o2 = F.scaled_dot_product_attention(qg[0], k[0], v[0]).reshape(o1.shape)
                        print(f"    grouped vs gqa max |diff| {(o1.float() - o2.float()).abs().max().item():.3g}")
                del k, v
                torch.cuda.empty_cache()
            if "naive-offload-sdpa" in peers:
                per = b * Hkv * ctx * D
                t0 = time.perf_counter()
                host = torch.empty(2 * L * per, dtype=torch.bfloat16, pin_memory=True)
                chunk = 1 << 28
                for off in range(0, host.numel(), chunk):
                    n = min(chunk, host.numel() - off)
                    host[off:off + n].copy_((torch.rand(n, device=dev, dtype=torch.bfloat16, generator=gen) * 2 - 1))
                print(f"    pinned + filled {host.numel() * 2 / 2**30:.1f} GiB in {time.perf_counter() - t0:.1f} s",
                      flush=True)
                kd = torch.empty(b, Hkv, ctx, D, device=dev, dtype=torch.bfloat16)
                vd = torch.empty_like(kd)

                def step_n():
                    for l in range(L):
                        kd.copy_(host[(2 * l) * per:(2 * l + 1) * per].view(b, Hkv, ctx, D), non_blocking=True)
                        vd.copy_(host[(2 * l + 1) * per:(2 * l + 2) * per].view(b, Hkv, ctx, D), non_blocking=True)
                        F.scaled_dot_product_attention(q[l].view(b, Hkv, G, D), kd, vd)
                med, mn, mx = time_steps(step_n, a.steps, a.warmup)
                record("naive-offload-sdpa", ctx, b, med, mn, mx, 2 * L * per * 2, per * 2)
                del host, kd, vd
                torch.cuda.empty_cache()
            del q
    with open(a.json, "w") as f:
        json.dump(dict(device=name, commit=a.commit, command=command, torch=torch.__version__, records=records),
                  f, indent=1)
    print(f"peers JSON written to {a.json}")


if __name__ == "__main__":
    main()
