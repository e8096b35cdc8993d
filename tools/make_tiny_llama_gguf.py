#!/usr/bin/env python3
"""Writes a tiny llama-architecture GGUF with random weights (needs `gguf` >= 0.19, numpy).

Real-shaped for the GPU kernels (head_dim 64, GQA 2), small enough to write at
test time: 4 layers, d_model 256, 4 query heads, 2 KV heads, FFN 512, vocab 512,
F32 tensors (~10 MB). Deterministic for a given --seed. No tokenizer metadata:
the tests that use it feed token ids directly.

    python3 tools/make_tiny_llama_gguf.py -o tiny_llama.gguf
"""
from __future__ import annotations

import argparse

import numpy as np
import gguf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=512)
    a = ap.parse_args()
    hd = a.d_model // a.heads
    rng = np.random.default_rng(a.seed)

    def mat(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        # numpy shape (rows=out, cols=in) is GGUF dims [in, out]; scaled so activations stay O(1).
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("activekv-tiny-llama")
    w.add_block_count(a.layers)
    w.add_context_length(4096)
    w.add_embedding_length(a.d_model)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tensor("token_embd.weight", rng.standard_normal((a.vocab, a.d_model)).astype(np.float32))
    w.add_tensor("output_norm.weight", norm(a.d_model))
    w.add_tensor("output.weight", mat(a.vocab, a.d_model, 4.0))
    for l in range(a.layers):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", norm(a.d_model))
        # Larger query/key gain: peaked, position-dependent attention, so the test exercises the softmax.
        w.add_tensor(p + "attn_q.weight", mat(a.heads * hd, a.d_model, 2.0))
        w.add_tensor(p + "attn_k.weight", mat(a.kv_heads * hd, a.d_model, 2.0))
        w.add_tensor(p + "attn_v.weight", mat(a.kv_heads * hd, a.d_model))
        w.add_tensor(p + "attn_output.weight", mat(a.d_model, a.heads * hd, 0.5))
        w.add_tensor(p + "ffn_norm.weight", norm(a.d_model))
        w.add_tensor(p + "ffn_gate.weight", mat(a.ffn, a.d_model))
        w.add_tensor(p + "ffn_up.weight", mat(a.ffn, a.d_model))
        w.add_tensor(p + "ffn_down.weight", mat(a.d_model, a.ffn, 0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
