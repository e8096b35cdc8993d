#!/usr/bin/env python3
"""Writes a llama-architecture GGUF of any shape with random weights: for SPEED
measurements only (`activekv bench`), NEVER for quality -- the model means
nothing, its text is noise.

The defaults are the "27B attention shape" of SPEC section 1, the file
llama.cpp was measured with on the H200: 16 layers, hidden 5120, 24 query
heads, 4 KV heads x head dim 256, FFN 17408, vocab 32000, every matrix Q4_0
(5.78B parameters, 3.25 GB).

    python3 tools/make_synthetic_gguf.py /tmp/x.gguf                 # the 27B shape
    python3 tools/make_synthetic_gguf.py /tmp/t.gguf --layers 2 --hidden 256 \\
        --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --vocab 512   # a tiny one for tests

Needs only Python 3 and numpy: the GGUF container (v3, docs/gguf.md) is written
by hand and streamed to the file, so memory stays bounded (~200 MB) and the
3.25 GB default takes about as long as the disk needs. Random values come from
one 64 MiB pool per type (numpy's PCG64, --seed), each matrix written from it
at a random offset: drawing 3.25 GB of random bytes would cost minutes, and a
speed-only model needs no more randomness than that.

Weights: every 2-D matrix (embedding, Q, K, V, O, gate, up, down, output head)
in --type; the norms F32 ones. Scales are chosen so that each matrix's entries
have standard deviation --weight-std / sqrt(fan_in) (embedding: 1): a random
linear map then keeps an activation's RMS about constant, RMSNorm before every
block resets it, and the residual stream grows only ~sqrt(2 x layers), so the
activations stay finite through the whole model (tested: tests/cli, `bench`
on a tiny shape checks the logits' tokens; `activekv generate --device cpu` runs).

Metadata: what ModelConfig (src/model/config.cpp) and the tokenizer
(src/tokenizer/tokenizer_gguf.cpp) require, with a minimal byte-level gpt2
vocabulary: <|endoftext|> (control; bos and eos), the 256 GPT-2 byte symbols,
then filler tokens "<synthetic_N>" up to --vocab; no merges.
general.name says the file is synthetic and not for quality.
"""
from __future__ import annotations

import argparse
import struct
import sys
import time

import numpy as np

# ggml type ids and block geometry (elements per block, bytes per block).
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q6_K": (14, 256, 210), "BF16": (30, 1, 2)}
# Quantised types: where each block's f16 scale(s) sit, and the std of a
# value in units of the scale when the other bytes are uniform random:
# Q4_0 nibbles 0..15 ((q-8)d: 4.61); Q8_0 -128..127 (73.9); Q4_K
# d (sc q - 7.5 m) with 6-bit sc, m and nibbles q, dmin = 7.5 d (the
# nibbles' mean, so the mean is 0): sqrt(E[sc^2] E[q^2] - (E sc E q)^2 +
# 7.5^2 Var m) = 258.3; Q6_K int8 scales (rms 73.9) times 6-bit codes - 32
# (rms 18.5).
SCALES = {"Q4_0": ((0,), 4.61), "Q8_0": ((0,), 73.9), "Q4_K": ((0, 2), 258.3), "Q6_K": ((208,), 73.9 * 18.5)}
# GGUF metadata value types.
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, T_UINT64 = 4, 5, 6, 7, 8, 9, 10
ALIGNMENT = 32
CHUNK_BYTES = 64 << 20  # rows generated and written per chunk


def gguf_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_entry(key: str, vtype: int, value) -> bytes:
    out = gguf_string(key) + struct.pack("<I", vtype)
    if vtype == T_STRING:
        return out + gguf_string(value)
    if vtype == T_UINT32:
        return out + struct.pack("<I", value)
    if vtype == T_FLOAT32:
        return out + struct.pack("<f", value)
    if vtype == T_BOOL:
        return out + struct.pack("<B", 1 if value else 0)
    if vtype == T_ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == T_STRING:
            return out + b"".join(gguf_string(s) for s in items)
        if etype == T_INT32:
            return out + np.asarray(items, dtype="<i4").tobytes()
    raise ValueError(f"unsupported metadata value type {vtype}")


def byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode map: the symbol of each byte 0..255, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    symbols, n = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + n)
            n += 1
    return [symbols[b] for b in range(256)]


def vocabulary(n_vocab: int) -> tuple[list[str], list[int]]:
    tokens = ["<|endoftext|>"] + byte_symbols()
    if n_vocab < len(tokens):
        raise SystemExit(f"--vocab {n_vocab}: at least {len(tokens)} (end-of-text plus the 256 byte tokens)")
    tokens += [f"<synthetic_{i}>" for i in range(n_vocab - len(tokens))]
    types = [3] + [1] * (n_vocab - 1)  # CONTROL, then NORMAL
    return tokens, types


class Tensor:
    """One tensor: GGUF dims [fan_in, rows] (ggml order), its type and how to fill it."""

    def __init__(self, name: str, fan_in: int, rows: int, ttype: str, std: float):
        self.name, self.fan_in, self.rows, self.ttype, self.std = name, fan_in, rows, ttype, std
        _, block, bb = TYPES[ttype]
        if fan_in % block:
            raise SystemExit(f"{name}: row length {fan_in} is not a multiple of the {ttype} block ({block})")
        self.row_bytes = fan_in // block * bb
        self.n_bytes = self.row_bytes * rows
        self.offset = 0

    def dims(self) -> list[int]:
        return [self.fan_in] if self.rows == 1 else [self.fan_in, self.rows]

    def info(self) -> bytes:
        d = self.dims()
        return (gguf_string(self.name) + struct.pack("<I", len(d)) + struct.pack(f"<{len(d)}Q", *d)
                + struct.pack("<IQ", TYPES[self.ttype][0], self.offset))


class RandomPool:
    """A pool of CHUNK_BYTES of random elements per type, drawn once: each matrix
    is its pool (scaled to the matrix's std) written over and over from a random
    block offset. Random bytes cost more than the disk, and a speed-only model
    needs no more randomness than that (its values never matter)."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.pools = rng, {}
        self.overflowed = []  # tensors whose entries do not fit their type (inf)

    def unit(self, ttype: str) -> np.ndarray:
        """Unscaled pool: blocks (quantised types) or unit-normal float32 values."""
        if ttype not in self.pools:
            _, block, bb = TYPES[ttype]
            n = CHUNK_BYTES // bb
            if block > 1:  # codes uniform (SCALES says what that makes the std)
                self.pools[ttype] = np.frombuffer(self.rng.bytes(n * bb), dtype=np.uint8).reshape(n, bb).copy()
            else:
                self.pools[ttype] = self.rng.standard_normal(n, dtype=np.float32)
        return self.pools[ttype]

    def scaled(self, t: "Tensor") -> np.ndarray:
        """The pool as raw bytes of t's type with entries of standard deviation t.std (t.std 0: all ones)."""
        if t.std == 0.0:
            return np.ones(t.fan_in * t.rows, dtype="<f4").view(np.uint8)
        u = self.unit(t.ttype)
        if t.ttype in SCALES:
            blk = u.copy()
            offsets, code_std = SCALES[t.ttype]
            with np.errstate(over="ignore"):
                d = np.float16(t.std / code_std)
                scales = [d] if len(offsets) == 1 else [d, np.float16(7.5 * float(d))]  # Q4_K: d, dmin
            if not all(np.isfinite(x) for x in scales):
                self.overflowed.append(t.name)
            for off, x in zip(offsets, scales):
                blk[:, off:off + 2] = np.frombuffer(x.tobytes(), dtype=np.uint8)
            return blk.reshape(-1)
        v = u * np.float32(t.std)
        if t.ttype == "F32":
            return v.astype("<f4").view(np.uint8)
        if t.ttype == "F16":
            with np.errstate(over="ignore"):
                h = v.astype("<f2")
            if not np.isfinite(h).all():
                self.overflowed.append(t.name)
            return h.view(np.uint8)
        b = v.view(np.uint32)  # BF16: round to nearest even from the float32 bits
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2").view(np.uint8)


def write_tensor(f, pool: RandomPool, t: "Tensor") -> None:
    """Streams t's bytes: its scaled pool from a random whole-block offset, wrapping."""
    src = pool.scaled(t)
    unit = TYPES[t.ttype][2]  # bytes of a block (quantised) or of an element
    pos = int(pool.rng.integers(0, src.size // unit)) * unit
    left = t.n_bytes
    while left:
        n = min(left, src.size - pos)
        f.write(memoryview(src[pos:pos + n]))
        left -= n
        pos = 0


def model_tensors(a) -> list[Tensor]:
    q_dim, kv_dim = a.heads * a.head_dim, a.kv_heads * a.head_dim
    w = lambda fan_in: a.weight_std / np.sqrt(fan_in)
    ts = [Tensor("token_embd.weight", a.hidden, a.vocab, a.type, 1.0)]
    for i in range(a.layers):
        p = f"blk.{i}."
        ts += [
            Tensor(p + "attn_norm.weight", a.hidden, 1, "F32", 0.0),
            Tensor(p + "attn_q.weight", a.hidden, q_dim, a.type, w(a.hidden)),
            Tensor(p + "attn_k.weight", a.hidden, kv_dim, a.type, w(a.hidden)),
            Tensor(p + "attn_v.weight", a.hidden, kv_dim, a.type, w(a.hidden)),
            Tensor(p + "attn_output.weight", q_dim, a.hidden, a.type, w(q_dim)),
            Tensor(p + "ffn_norm.weight", a.hidden, 1, "F32", 0.0),
            Tensor(p + "ffn_gate.weight", a.hidden, a.ffn, a.type, w(a.hidden)),
            Tensor(p + "ffn_up.weight", a.hidden, a.ffn, a.type, w(a.hidden)),
            Tensor(p + "ffn_down.weight", a.ffn, a.hidden, a.type, w(a.ffn)),
        ]
    ts += [Tensor("output_norm.weight", a.hidden, 1, "F32", 0.0),
           Tensor("output.weight", a.hidden, a.vocab, a.type, w(a.hidden))]
    return ts


def metadata(a) -> list[bytes]:
    tokens, types = vocabulary(a.vocab)
    arch = "llama"
    name = (f"synthetic random {a.type} llama ({a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads x "
            f"{a.head_dim}, FFN {a.ffn}, vocab {a.vocab}): for speed only, never for quality")
    return [
        kv_entry("general.architecture", T_STRING, arch),
        kv_entry("general.name", T_STRING, name),
        kv_entry("general.alignment", T_UINT32, ALIGNMENT),
        kv_entry(f"{arch}.block_count", T_UINT32, a.layers),
        kv_entry(f"{arch}.context_length", T_UINT32, a.ctx),
        kv_entry(f"{arch}.embedding_length", T_UINT32, a.hidden),
        kv_entry(f"{arch}.feed_forward_length", T_UINT32, a.ffn),
        kv_entry(f"{arch}.attention.head_count", T_UINT32, a.heads),
        kv_entry(f"{arch}.attention.head_count_kv", T_UINT32, a.kv_heads),
        kv_entry(f"{arch}.attention.key_length", T_UINT32, a.head_dim),
        kv_entry(f"{arch}.attention.value_length", T_UINT32, a.head_dim),
        kv_entry(f"{arch}.attention.layer_norm_rms_epsilon", T_FLOAT32, 1e-5),
        kv_entry(f"{arch}.rope.dimension_count", T_UINT32, a.head_dim),
        kv_entry(f"{arch}.rope.freq_base", T_FLOAT32, 10000.0),
        kv_entry(f"{arch}.vocab_size", T_UINT32, a.vocab),
        kv_entry("tokenizer.ggml.model", T_STRING, "gpt2"),
        kv_entry("tokenizer.ggml.pre", T_STRING, "gpt2"),
        kv_entry("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        kv_entry("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, types)),
        kv_entry("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [])),
        kv_entry("tokenizer.ggml.bos_token_id", T_UINT32, 0),
        kv_entry("tokenizer.ggml.eos_token_id", T_UINT32, 0),
    ]


def pad(n: int) -> int:
    return (ALIGNMENT - n % ALIGNMENT) % ALIGNMENT


def write(a) -> None:
    t0 = time.time()
    tensors = model_tensors(a)
    off = 0
    for t in tensors:
        t.offset = off
        off += t.n_bytes + pad(t.n_bytes)
    kvs = metadata(a)
    pool = RandomPool(np.random.default_rng(a.seed))
    with open(a.out, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
        for kv in kvs:
            f.write(kv)
        for t in tensors:
            f.write(t.info())
        f.write(b"\0" * pad(f.tell()))
        for t in tensors:
            write_tensor(f, pool, t)
            f.write(b"\0" * pad(t.n_bytes))
        size = f.tell()
    if pool.overflowed:
        print(f"warning: --weight-std {a.weight_std:g} overflows {a.type} in {len(pool.overflowed)} tensors (e.g. "
              f"{pool.overflowed[0]}): their weights are inf, the model is broken (useful only to check that "
              "activekv bench refuses non-finite logits)", file=sys.stderr)
    params = sum(t.fan_in * t.rows for t in tensors)
    print(f"wrote {a.out}: llama, {a.layers} layers, hidden {a.hidden}, {a.heads} query heads, {a.kv_heads} KV heads x "
          f"{a.head_dim}, FFN {a.ffn}, vocab {a.vocab}; {len(tensors)} tensors, {params / 1e9:.3f}B parameters "
          f"({a.type} matrices, F32 norms), {size:,} bytes ({size / 1e9:.2f} GB) in {time.time() - t0:.1f} s. "
          f"Random weights: for speed only, never for quality.")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description="Write a llama-architecture GGUF with random weights. For speed measurements ONLY "
                    "(activekv bench), never for quality: the model is noise. Defaults: SPEC section 1's "
                    "27B attention shape (5.78B parameters, 3.25 GB in Q4_0).")
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=5120, help="embedding length")
    p.add_argument("--heads", type=int, default=24, help="query heads")
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=256)
    p.add_argument("--ffn", type=int, default=17408, help="feed-forward length")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--ctx", type=int, default=262144, help="llama.context_length (trained context) recorded")
    p.add_argument("--type", default="Q4_0", choices=sorted(TYPES), help="type of every matrix (norms stay F32)")
    p.add_argument("--weight-std", type=float, default=0.5,
                   help="matrix entries' standard deviation times sqrt(fan-in)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "ctx"):
        if getattr(a, k) <= 0:
            p.error(f"--{k.replace('_', '-')} must be positive")
    if a.heads % a.kv_heads:
        p.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.head_dim % 2:
        p.error(f"--head-dim {a.head_dim} must be even")
    if not (a.weight_std > 0 and np.isfinite(a.weight_std)):
        p.error("--weight-std must be a finite number > 0")
    write(a)


if __name__ == "__main__":
    main()
