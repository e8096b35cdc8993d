#!/usr/bin/env python3
"""A bounded load test of `activekv serve` on loopback.

Sends a fixed number of streamed completion requests (-n) from a fixed
number of concurrent clients (-c), and stops by itself: after the count, or
once --duration seconds have passed (requests in flight then finish; none
start). Reports requests/s, generated tokens/s, TTFT and inter-token latency
percentiles measured at the client, and error counts by HTTP status.

  tools/serve_load.py --start build/bin/activekv -n 64 -c 16 --max-tokens 32   # starts and stops a server
  tools/serve_load.py --port 8080 -n 64 -c 16                                  # a running server
  tools/serve_load.py --port 8080 -n 16 -c 16 --prompt-chars 32768             # long prompts (depth)

Prompts are short by default; --prompt-chars N makes each about N
characters (a distinct request number first, then filler text): N tokens on
a byte-level tokenizer such as tools/make_synthetic_gguf.py's, fewer on a
real model's (the JSON records the prompt tokens the server counted).

Standard library only (the HTTP client is tests/serve/serve_client.py)."""
import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
from serve_client import Server, stream  # noqa: E402


def percentile(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, help="a running server's port")
    ap.add_argument("--start", metavar="ACTIVEKV", help="start `ACTIVEKV serve` on a free port (and stop it after)")
    ap.add_argument("--serve-args", default="", help="extra arguments for --start (one string)")
    ap.add_argument("-m", "--model", help="the model --start serves (default: the tests' default model)")
    ap.add_argument("-n", "--requests", type=int, default=64)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=300, help="seconds after which no request starts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-chars", type=int, default=0, help="make each prompt about this many characters")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    if (a.port is None) == (a.start is None):
        ap.error("give exactly one of --port and --start")
    srv = None
    if a.start:
        srv = Server(a.start, *a.serve_args.split(), model=a.model, device=None)  # serve's own default device (auto)
        srv.wait_ready()
        a.port = srv.port

    if a.prompt_chars < 0:
        ap.error("--prompt-chars must be >= 0")
    filler = "The quick brown fox jumps over the lazy dog. "

    def prompt(i):
        head = "Request %d: write a few sentences about the number %d." % (i, i)
        if a.prompt_chars <= len(head):
            return head
        body = (filler * (a.prompt_chars // len(filler) + 1))[: a.prompt_chars - len(head) - 1]
        return head + " " + body

    lock = threading.Lock()
    next_req = [0]
    ttft, itl, statuses, tokens, prompt_tokens = [], [], {}, [0], []
    t_start = time.time()

    def client():
        while True:
            with lock:
                i = next_req[0]
                if i >= a.requests or time.time() - t_start > a.duration:
                    return
                next_req[0] += 1
            body = {"prompt": prompt(i), "max_tokens": a.max_tokens, "temperature": 0.7, "seed": i,
                    "stream_options": {"include_usage": True}}
            t0 = time.time()
            try:
                status, events, done, times = stream(a.port, "/v1/completions", body)
                if status == 200 and not done:
                    status = "incomplete"
                usage = [e["usage"] for e in events if e.get("usage")]
                # The usage chunk (no choices) is not a token: its time is left out.
                times = [t for e, t in zip(events, times) if e.get("choices")]
            except OSError as e:
                status, times, usage = type(e).__name__, [], []
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if status == 200 and times:
                    ttft.append(times[0] - t0)
                    itl.extend(b - x for x, b in zip(times, times[1:]))
                    tokens[0] += len(times)
                    prompt_tokens.extend(u.get("prompt_tokens", 0) for u in usage)

    threads = [threading.Thread(target=client) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t_start
    ok = statuses.get(200, 0)
    res = {"command": " ".join(sys.argv), "requests": next_req[0], "concurrency": a.concurrency, "max_tokens": a.max_tokens, "wall_s": wall,
           "prompt_chars": a.prompt_chars, "serve_args": a.serve_args if a.start else None,
           "model": (a.model or "default") if a.start else None,
           "prompt_tokens": {"min": min(prompt_tokens), "max": max(prompt_tokens)} if prompt_tokens else None,
           "ok": ok, "errors": {str(k): v for k, v in statuses.items() if k != 200},
           "requests_per_s": ok / wall, "stream_chunks_per_s": tokens[0] / wall,
           "ttft_s": {"p50": percentile(ttft, 0.5), "p90": percentile(ttft, 0.9), "p99": percentile(ttft, 0.99)},
           "itl_s": {"p50": percentile(itl, 0.5), "p90": percentile(itl, 0.9), "p99": percentile(itl, 0.99)}}
    print("%d requests (%d ok) from %d clients in %.1f s: %.2f requests/s, %.1f chunks/s; TTFT p50 %.3f p90 %.3f "
          "p99 %.3f s; ITL p50 %.3f p90 %.3f p99 %.3f s; errors %s"
          % (res["requests"], ok, a.concurrency, wall, res["requests_per_s"], res["stream_chunks_per_s"],
             *res["ttft_s"].values(), *res["itl_s"].values(), res["errors"] or "none"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    if srv:
        srv.stop()
    return 0 if ok == res["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
