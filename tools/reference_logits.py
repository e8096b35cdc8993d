#!/usr/bin/env python3
"""Independent reference logits for ActiveKV (golden file for the logits tests).

What it does
------------
Loads the GGUF model with Hugging Face transformers (which dequantises every
GGUF tensor to float and un-permutes the llama.cpp-style Q/K weights), runs it
in float32 on the CPU, and writes a golden JSON containing:

  * ``token_ids``: N (default 300) tokens of real prose from
    pride-and-prejudice.txt (raw file bytes starting at ``text_byte_offset``,
    CRLF line endings kept as they are in the file), tokenized by the
    tokenizer embedded in the GGUF, no BOS;
  * ``positions``: for every position p in 0..N-1 the top-8 ids and logits,
    the argmax and the logsumexp of the logits that predict token p+1 from
    token_ids[0..p] (one causal forward pass over all N tokens);
  * ``greedy``: a 64-token prompt from wikitext2-test.raw and its 32-token
    greedy continuation (manual loop, full recomputation every step, fp32).
    The prompt is the first article paragraph, in file order, whose greedy path
    has no near-tie (top1-top2 gap >= --min-gap, default 0.1, at every step);
  * ``chat_greedy``: the same for a short chat-template prompt (stops early at
    <|im_end|>).

Logits are rounded to 6 decimals. The script also prints sanity figures
(top-1 agreement with the real next token, mean NLL / perplexity, decoded
greedy text) and, with ``--crosscheck``, re-computes the window's logits with a
second, fully independent float64 forward written here from the raw GGUF
tensors (gguf-py dequantisation, llama.cpp's interleaved-pair RoPE on the
permuted Q/K as stored) and reports the max |diff| against transformers.

How to run (from the repository root; needs torch, transformers>=5, gguf,
accelerate, numpy):

    python3 tools/reference_logits.py \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tests/golden/smollm2_logits.json --crosscheck
    python3 tools/reference_logits.py \
        --model models/gemma-3-270m-q4_k_m.gguf \
        --out tests/golden/gemma3_logits.json --n 640

Models whose GGUF says tokenizer.ggml.add_bos_token (Gemma 3) get their BOS
in front of every sequence (the window, the greedy prompt), as they are
trained; token_ids then start with it. For Gemma 3 the window is longer than
its 512-token sliding window (--n 640), so the last 128 positions check the
local layers' window; the chat prompt is Gemma's turn format, built by hand
(the GGUF carries no chat template). --crosscheck is for llama models only.

Everything is deterministic: fixed text offsets, torch.manual_seed(0),
torch.use_deterministic_algorithms(True), 2 torch threads, eager attention.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "tests/golden/smollm2_logits.json"
DEFAULT_PROSE = "data/texts/pride-and-prejudice.txt"  # paths relative to the checkout, as the two above
DEFAULT_WIKI = "data/texts/wikitext2-test.raw"
PROSE_ANCHOR = "It is a truth universally acknowledged"   # start of Chapter I
TOP_K = 8


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r6(x: float) -> float:
    return round(float(x), 6)


def window_from_file(path: str, anchor: str, n_tokens: int, tok, bos=None):
    """Find `anchor` in the raw bytes, tokenize a generous slice from there,
    keep the first n_tokens ids (counting `bos` in front, if given).
    Returns (byte_offset, ids, exact text)."""
    raw = open(path, "rb").read()
    off = raw.find(anchor.encode("utf-8"))
    if off < 0:
        sys.exit(f"anchor {anchor!r} not found in {path}")
    text = raw[off:off + 16 * n_tokens].decode("utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < n_tokens + 8:
        sys.exit("text slice too short")
    ids = ids[:n_tokens - (bos is not None)]
    covered = tok.decode(ids, clean_up_tokenization_spaces=False)
    if not text.startswith(covered):
        sys.exit("decoded window is not a prefix of the source text")
    return off, ([bos] if bos is not None else []) + ids, covered


@torch.no_grad()
def greedy(model, prompt_ids, n_new, stop_id=None, abort_gap=None):
    """Manual greedy loop, full recomputation each step (no KV cache).
    Returns (ids, top1-top2 gaps); None if abort_gap is set and some step's gap
    falls below it (a near-tie that a quantised engine could legitimately flip)."""
    ids = list(prompt_ids)
    out, gaps = [], []
    for _ in range(n_new):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        nxt = int(top2.indices[0])
        gap = float(top2.values[0] - top2.values[1])
        if abort_gap is not None and gap < abort_gap:
            return None
        out.append(nxt)
        gaps.append(r6(gap))
        ids.append(nxt)
        if stop_id is not None and nxt == stop_id:
            break
    return out, gaps


def wiki_prompts(path: str, n_tokens: int, tok, bos=None):
    """Article paragraphs of wikitext (lines starting with ' ' but not ' ='),
    in file order, as (byte_offset, first n_tokens ids, their text); `bos`
    (if given) in front, counted in n_tokens."""
    raw = open(path, "rb").read()
    off = 0
    for line in raw.split(b"\n"):
        start, off = off, off + len(line) + 1
        if not line.startswith(b" ") or line.startswith(b" =") or len(line) < 8 * n_tokens:
            continue
        text = line.decode("utf-8")
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) < n_tokens + 8:
            continue
        ids = ids[:n_tokens - (bos is not None)]
        covered = tok.decode(ids, clean_up_tokenization_spaces=False)
        assert text.startswith(covered)
        yield start, ([bos] if bos is not None else []) + ids, covered


# ---------------------------------------------------------------------------
# Independent float64 forward straight from the GGUF (llama.cpp convention).
# ---------------------------------------------------------------------------
@torch.no_grad()
def gguf_forward_f64(path: str, ids: list[int]) -> torch.Tensor:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(path)

    def field(k):
        return r.fields[k].contents()

    n_layer = int(field("llama.block_count"))
    n_head = int(field("llama.attention.head_count"))
    n_kv = int(field("llama.attention.head_count_kv"))
    d = int(field("llama.embedding_length"))
    eps = float(field("llama.attention.layer_norm_rms_epsilon"))
    base = float(field("llama.rope.freq_base"))
    hd = d // n_head
    W = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type)           # shape (ne1, ne0) = (out, in)
        W[t.name] = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))

    T = len(ids)
    emb = W["token_embd.weight"]
    x = emb[torch.tensor(ids)]

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps) * w

    # llama.cpp LLAMA_ROPE_TYPE_NORM: rotate adjacent pairs (2i, 2i+1)
    pos = torch.arange(T, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos * inv[None, :]                            # (T, hd/2)
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rope(v):                                        # (T, H, hd)
        a, b = v[..., 0::2], v[..., 1::2]
        o = torch.empty_like(v)
        o[..., 0::2] = a * cos - b * sin
        o[..., 1::2] = a * sin + b * cos
        return o

    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    grp = n_head // n_kv
    for l in range(n_layer):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T).view(T, n_head, hd))
        k = rope((h @ W[p + "attn_k.weight"].T).view(T, n_kv, hd))
        v = (h @ W[p + "attn_v.weight"].T).view(T, n_kv, hd)
        k = k.repeat_interleave(grp, dim=1)             # head j uses kv head j // grp
        v = v.repeat_interleave(grp, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        a = torch.softmax(s, -1)
        o = torch.einsum("hts,shd->thd", a, v).reshape(T, d)
        x = x + o @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        g = h @ W[p + "ffn_gate.weight"].T
        u = h @ W[p + "ffn_up.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ W[p + "ffn_down.weight"].T
    x = rms(x, W["output_norm.weight"])
    out_w = W.get("output.weight", emb)                 # tied embeddings
    return x @ out_w.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="GGUF file")
    ap.add_argument("--out", default=DEFAULT_OUT, help="golden JSON to write")
    ap.add_argument("--prose", default=DEFAULT_PROSE)
    ap.add_argument("--wiki", default=DEFAULT_WIKI)
    ap.add_argument("--n", type=int, default=300, help="window length in tokens")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--min-gap", type=float, default=0.1,
                    help="min top1-top2 logit gap required at every greedy step")
    ap.add_argument("--crosscheck", action="store_true",
                    help="also run an independent float64 GGUF forward and compare")
    args = ap.parse_args()

    t0 = time.time()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mdir, mname = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(mdir, gguf_file=mname)
    model = AutoModelForCausalLM.from_pretrained(
        mdir, gguf_file=mname, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    t_load = time.time() - t0
    from gguf import GGUFReader
    meta = GGUFReader(args.model).fields
    arch = meta["general.architecture"].contents()
    add_bos = "tokenizer.ggml.add_bos_token" in meta and bool(
        meta["tokenizer.ggml.add_bos_token"].contents())
    bos = tok.bos_token_id if add_bos else None
    if args.crosscheck and arch != "llama":
        sys.exit(f"--crosscheck implements the llama forward only, not {arch}")

    # ---- window of prose: one causal forward pass over all N tokens ----
    off, ids, covered = window_from_file(args.prose, PROSE_ANCHOR, args.n, tok, bos)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()      # (N, V)
    lse = torch.logsumexp(logits, -1)
    topv, topi = torch.topk(logits, TOP_K, -1)
    positions = []
    for p in range(len(ids)):
        positions.append({
            "pos": p,
            "ids": [int(i) for i in topi[p]],
            "logits": [r6(v) for v in topv[p]],
            "argmax": int(topi[p, 0]),
            "logsumexp": r6(lse[p]),
        })
    tgt = torch.tensor(ids[1:])
    nll = (lse[:-1] - logits[:-1].gather(1, tgt[:, None])[:, 0]).double()
    mean_nll = float(nll.mean())
    top1 = float((topi[:-1, 0] == tgt).double().mean())
    in_top8 = float((topi[:-1] == tgt[:, None]).any(-1).double().mean())
    min_gap = float((topv[:, 0] - topv[:, 1]).min())

    # ---- greedy continuation of a wikitext prompt ----
    # Take the first article paragraph (file order) whose greedy path has no
    # near-tie (every top1-top2 gap >= --min-gap), so that the golden sequence
    # is a fair exact-match target for an engine with quantised arithmetic.
    skipped = []
    for woff, wids, wtext in wiki_prompts(args.wiki, args.prompt_len, tok, bos):
        res = greedy(model, wids, args.new_tokens, abort_gap=args.min_gap)
        if res is not None:
            cont, gaps = res
            break
        skipped.append(woff)
        print(f"  wikitext prompt @ byte {woff}: near-tie in greedy path, skipped")
        if len(skipped) >= 20:
            sys.exit("no robust greedy prompt found")

    # ---- chat greedy ----
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    if arch == "gemma3":  # Gemma's turn format (google/gemma-3-270m-it's template)
        chat_text = (f"<start_of_turn>user\n{msgs[0]['content']}<end_of_turn>\n"
                     "<start_of_turn>model\n")
        chat_ids = [bos] + tok(chat_text, add_special_tokens=False)["input_ids"]
        eos = tok.convert_tokens_to_ids("<end_of_turn>")
    else:
        chat_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):
            chat_ids = chat_ids["input_ids"]
        eos = tok.convert_tokens_to_ids("<|im_end|>")
    chat_ids = [int(i) for i in chat_ids]
    chat_cont, chat_gaps = greedy(model, chat_ids, args.new_tokens, stop_id=eos)
    t_run = time.time() - t0

    golden = {
        "model_file": os.path.basename(args.model),
        "model_sha256": sha256_file(args.model),
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                     f"float32, CPU",
        "generator": "tools/reference_logits.py",
        "architecture": arch,
        "bos_prepended": bos is not None,
        "text_file": os.path.basename(args.prose),
        "text_byte_offset": off,
        "text_byte_length": len(covered.encode("utf-8")),
        "text": covered,
        "n_tokens": len(ids),
        "token_ids": ids,
        "top_k": TOP_K,
        "positions": positions,
        "stats": {
            "mean_nll": round(mean_nll, 6),
            "perplexity": round(math.exp(mean_nll), 4),
            "top1_next_token_agreement": round(top1, 6),
            "next_token_in_top8": round(in_top8, 6),
            "min_top1_top2_gap": r6(min_gap),
        },
        "greedy": {
            "text_file": os.path.basename(args.wiki),
            "text_byte_offset": woff,
            "prompt_text": wtext,
            "prompt_ids": wids,
            "continuation_ids": cont,
            "continuation_text": tok.decode(cont),
            "top1_top2_gaps": gaps,
            "method": "manual greedy loop, full recomputation each step, float32",
            "selection": f"first wikitext article paragraph (file order) whose {args.new_tokens} greedy "
                         f"steps all have top1-top2 gap >= {args.min_gap}",
            "skipped_prompt_byte_offsets": skipped,
        },
        "chat_greedy": {
            "messages": msgs,
            "prompt_ids": chat_ids,
            "continuation_ids": chat_cont,
            "continuation_text": tok.decode(chat_cont),
            "top1_top2_gaps": chat_gaps,
            "stop_id": eos,
            "method": "chat template from the GGUF, add_generation_prompt; greedy, "
                      "stops after emitting stop_id or max new tokens",
        },
    }

    print(f"model      : {args.model}  sha256 {golden['model_sha256'][:16]}...")
    print(f"reference  : {golden['reference']}")
    print(f"window     : {args.prose} @ byte {off}, {len(ids)} tokens, "
          f"{golden['text_byte_length']} bytes")
    print(f"top-1 agreement with next token: {top1*100:.2f}%  (in top-8: {in_top8*100:.2f}%)")
    print(f"mean NLL {mean_nll:.4f} nats  ->  perplexity {math.exp(mean_nll):.3f}")
    print(f"min top1-top2 logit gap over window: {min_gap:.6f}")
    print(f"greedy prompt   : {wtext!r}")
    print(f"greedy continuation ids : {cont}")
    print(f"greedy continuation text: {tok.decode(cont)!r}")
    print(f"greedy min gap  : {min(gaps):.6f}")
    print(f"chat prompt ids : {chat_ids}")
    print(f"chat continuation: {tok.decode(chat_cont)!r}  (min gap {min(chat_gaps):.6f})")

    if args.crosscheck:
        tc = time.time()
        ref64 = gguf_forward_f64(args.model, ids)
        diff = (ref64 - logits.double()).abs()
        am = (ref64.argmax(-1) == logits.argmax(-1)).double().mean()
        lse64 = torch.logsumexp(ref64, -1)
        golden["crosscheck"] = {
            "method": "independent float64 forward from gguf-py dequantised tensors, "
                      "llama.cpp interleaved-pair RoPE on the stored (permuted) Q/K",
            "max_abs_logit_diff": float(f"{float(diff.max()):.3e}"),
            "mean_abs_logit_diff": float(f"{float(diff.mean()):.3e}"),
            "max_abs_logsumexp_diff": float(f"{float((lse64 - lse.double()).abs().max()):.3e}"),
            "argmax_agreement": float(am),
        }
        print(f"crosscheck (f64 GGUF forward, {time.time()-tc:.1f}s): "
              f"{golden['crosscheck']}")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(golden, f, separators=(",", ":"), ensure_ascii=False)
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes); "
          f"load {t_load:.1f}s, total {time.time()-t0:.1f}s")


if __name__ == "__main__":
    main()
