#!/usr/bin/env python3
"""Writes a tiny random qwen2 GGUF and transformers' float32 logits for it.

What it does
------------
Builds a Qwen2ForCausalLM with random weights in transformers (float32, fixed
seed; sizes by flags), writes it as GGUF the way llama.cpp's
convert_hf_to_gguf.py does for qwen2 with `--outtype f32` (tensor names from
gguf-py's qwen2 name map; Q/K weights stored as they are, NOT permuted: qwen2
uses NEOX RoPE; the TextModel metadata keys), and writes a golden JSON:

  * ``token_ids``: N (default 40) random token ids (seeded);
  * ``logits``: transformers' logits for every position and every vocabulary
    entry, [N][vocab], from one causal forward pass, rounded to 6 decimals;
    ``argmax`` and ``top1_top2_gap`` per position;
  * ``greedy``: a ``--prompt-len`` random prompt and its ``--new-tokens``
    greedy continuation (manual argmax loop, full fp32 recomputation every
    step). The prompt is the first of a seeded series whose every step has a
    top1-top2 gap >= ``--min-gap`` (0.3), so an engine with bf16 GEMM inputs
    (the GPU prefill) has no near-tie to flip;
  * ``crosscheck``: max |diff| of an independent float64 forward pass written
    here from the GGUF tensors as stored (NEOX RoPE pairs (i, i + d/2), biases
    added before RoPE) against transformers. The script fails if it exceeds
    1e-3: the file would not be the model transformers ran.

Weights are not transformers' default initialisation (std 0.02, zero biases,
unit norms), which would give near-uniform logits and zero biases. They are
scaled so that activations stay O(1), attention is peaked and position
dependent, and every Q/K/V bias is a random O(1) vector: a forward pass that
drops a bias, adds it after RoPE or pairs the wrong RoPE channels is off by
far more than fp32 noise.

Default sizes keep the file under 1 MB (it is committed; CI has no torch):
2 layers, hidden 128, 2 query heads of dim 64 (the GPU kernels need 64, 128 or
256), 1 KV head (GQA group 2), FFN 96, vocab 96, rope_theta 1e6, RMS eps 1e-6,
untied output (output.weight present). No tokenizer metadata: the tests feed
token ids; the model config takes the vocabulary size from token_embd.weight.

How to run (from the repository root; needs torch, transformers >= 5,
gguf == 0.19, numpy):

    python3 tools/make_tiny_qwen2.py \\
        --gguf tests/fixtures/qwen2/tiny_qwen2.gguf \\
        --golden tests/golden/tiny_qwen2_logits.json

Deterministic: torch.manual_seed, use_deterministic_algorithms, 2 threads,
eager attention; two runs give identical files.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import sys

import numpy as np
import torch

import gguf

DEFAULT_GGUF = "tests/fixtures/qwen2/tiny_qwen2.gguf"
DEFAULT_GOLDEN = "tests/golden/tiny_qwen2_logits.json"
CROSSCHECK_LIMIT = 1e-3


def r6(x: float) -> float:
    return round(float(x), 6)


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def build_model(a: argparse.Namespace):
    """A Qwen2ForCausalLM with the scaled random weights described above."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.context, rope_theta=a.rope_theta, rms_norm_eps=a.rms_eps,
        tie_word_embeddings=False, use_sliding_window=False)
    model = Qwen2ForCausalLM._from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    g = torch.Generator().manual_seed(a.seed)

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float64).mul(std).float()

    # Gains: Q/K 2 (peaked attention), O and down 0.5 (the residual stream
    # stays O(1) over the layers), head 4 (logits spread over a few units, so
    # argmax is well separated). Norm weights 1 + N(0, 0.1).
    gain = {"q_proj": 2.0, "k_proj": 2.0, "v_proj": 1.0, "o_proj": 0.5,
            "gate_proj": 1.0, "up_proj": 1.0, "down_proj": 0.5, "lm_head": 4.0}
    bias_std = {"q_proj": 1.0, "k_proj": 1.0, "v_proj": 0.5}
    with torch.no_grad():
        for name, p in model.named_parameters():
            module = name.split(".")[-2]
            if name.endswith("embed_tokens.weight"):
                p.copy_(normal(p.shape, 1.0))
            elif "norm" in module:
                p.copy_(1.0 + normal(p.shape, 0.1))
            elif name.endswith(".bias"):
                p.copy_(normal(p.shape, bias_std[module]))
            else:
                p.copy_(normal(p.shape, gain[module] / math.sqrt(p.shape[1])))
    model.eval()
    return model


def write_gguf(model, a: argparse.Namespace, path: str) -> None:
    """What convert_hf_to_gguf.py (Qwen2Model, --outtype f32) writes, less the tokenizer."""
    hp = model.config
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    w = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN2])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name("activekv-tiny-qwen2")
    w.add_block_count(hp.num_hidden_layers)
    w.add_context_length(hp.max_position_embeddings)
    w.add_embedding_length(hp.hidden_size)
    w.add_feed_forward_length(hp.intermediate_size)
    w.add_head_count(hp.num_attention_heads)
    w.add_head_count_kv(hp.num_key_value_heads)
    w.add_rope_freq_base(a.rope_theta)
    w.add_layer_norm_rms_eps(hp.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, hp.num_hidden_layers)
    for name, p in model.state_dict().items():
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            sys.exit(f"no GGUF name for {name}")
        # numpy shape (out, in) is GGUF dims [in, out]; no permutation (NEOX RoPE).
        w.add_tensor(new, p.detach().numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_forward_f64(path: str, ids: list[int]) -> np.ndarray:
    """llama.cpp's qwen2 graph in float64 from the tensors as stored."""
    r = gguf.GGUFReader(path)

    def field(k):
        return r.fields[k].contents()

    n_layer = int(field("qwen2.block_count"))
    n_head = int(field("qwen2.attention.head_count"))
    n_kv = int(field("qwen2.attention.head_count_kv"))
    d = int(field("qwen2.embedding_length"))
    eps = float(field("qwen2.attention.layer_norm_rms_epsilon"))
    base = float(field("qwen2.rope.freq_base"))
    hd = d // n_head
    W = {t.name: np.asarray(t.data, dtype=np.float64).reshape([int(n) for n in reversed(t.shape)])
         for t in r.tensors}
    T = len(ids)
    x = W["token_embd.weight"][ids]

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    ang = np.arange(T)[:, None] * base ** (-np.arange(0, hd, 2) / hd)[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(v):  # NEOX: pairs (i, i + hd/2)
        a, b = v[..., : hd // 2], v[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(n_layer):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope((h @ W[p + "attn_q.weight"].T + W[p + "attn_q.bias"]).reshape(T, n_head, hd))
        k = rope((h @ W[p + "attn_k.weight"].T + W[p + "attn_k.bias"]).reshape(T, n_kv, hd))
        v = (h @ W[p + "attn_v.weight"].T + W[p + "attn_v.bias"]).reshape(T, n_kv, hd)
        k = np.repeat(k, n_head // n_kv, axis=1)  # query head j reads KV head j // group
        v = np.repeat(v, n_head // n_kv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shd->thd", s, v).reshape(T, d) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        g = h @ W[p + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return rms(x, W["output_norm.weight"]) @ W["output.weight"].T


@torch.no_grad()
def greedy(model, prompt: list[int], n_new: int):
    ids, out, gaps = list(prompt), [], []
    for _ in range(n_new):
        top2 = torch.topk(model(torch.tensor([ids])).logits[0, -1], 2)
        out.append(int(top2.indices[0]))
        gaps.append(r6(top2.values[0] - top2.values[1]))
        ids.append(out[-1])
    return out, gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help="GGUF file to write")
    ap.add_argument("--golden", default=DEFAULT_GOLDEN, help="golden JSON to write")
    ap.add_argument("--seed", type=int, default=20251201)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--kv-heads", type=int, default=1)
    ap.add_argument("--ffn", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--context", type=int, default=4096, help="max_position_embeddings")
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--rms-eps", type=float, default=1e-6)
    ap.add_argument("--tokens", type=int, default=40, help="length of the logits window")
    ap.add_argument("--prompt-len", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--min-gap", type=float, default=0.3,
                    help="min top1-top2 logit gap at every greedy step")
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    import transformers

    model = build_model(a)
    write_gguf(model, a, a.gguf)

    rng = np.random.default_rng(a.seed)
    ids = [int(i) for i in rng.integers(0, a.vocab, a.tokens)]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()  # (N, vocab)
    top2 = torch.topk(logits, 2, -1)
    ref = gguf_forward_f64(a.gguf, ids)
    cross = float(np.abs(ref - logits.double().numpy()).max())
    print(f"crosscheck: float64 GGUF forward vs transformers max |dlogit| = {cross:.3e}")
    if not cross <= CROSSCHECK_LIMIT:
        sys.exit(f"crosscheck failed: {cross} > {CROSSCHECK_LIMIT}")
    for skipped in range(1000):
        prompt = [int(i) for i in rng.integers(0, a.vocab, a.prompt_len)]
        cont, gaps = greedy(model, prompt, a.new_tokens)
        if min(gaps) >= a.min_gap:
            break
    else:
        sys.exit(f"no prompt with every greedy gap >= {a.min_gap} in 1000 tries")

    golden = {
        "generator": "tools/make_tiny_qwen2.py",
        "command": "python3 " + " ".join(sys.argv),
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, CPU, "
                     f"eager attention; gguf {importlib.metadata.version('gguf')}, "
                     f"numpy {np.__version__}, Python {platform.python_version()}",
        "gguf_file": os.path.relpath(a.gguf),
        "gguf_sha256": sha256_file(a.gguf),
        "config": {k: getattr(a, k) for k in ("seed", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab",
                                              "context", "rope_theta", "rms_eps")},
        "token_ids": ids,
        "logits": [[r6(v) for v in row] for row in logits],
        "argmax": [int(i) for i in top2.indices[:, 0]],
        "top1_top2_gap": [r6(v) for v in top2.values[:, 0] - top2.values[:, 1]],
        "greedy": {"prompt_ids": prompt, "continuation_ids": cont, "top1_top2_gaps": gaps,
                   "prompts_skipped_for_near_ties": skipped},
        "crosscheck": {"what": "float64 forward from the GGUF tensors (NEOX RoPE, Q/K/V biases) vs transformers",
                       "max_abs_dlogit": float(f"{cross:.3e}")},
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.golden)), exist_ok=True)
    with open(a.golden, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    lg = logits.abs().max().item()
    print(f"wrote {a.gguf} ({os.path.getsize(a.gguf)} bytes) and {a.golden}")
    print(f"max |logit| {lg:.2f}; smallest top1-top2 gap {top2.values[:, 0].sub(top2.values[:, 1]).min():.4f}; "
          f"distinct argmax {len(set(golden['argmax']))}; greedy {cont} (smallest gap {min(gaps):.4f}, "
          f"{skipped} prompts skipped)")


if __name__ == "__main__":
    main()
