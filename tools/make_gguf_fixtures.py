#!/usr/bin/env python3
"""Writes the GGUF test fixtures and the fuzz seed corpus.

Run from the repository root (needs `pip install gguf numpy`, gguf >= 0.19):

    python3 tools/make_gguf_fixtures.py

Outputs (all deterministic, seeded RNG):
  tests/fixtures/gguf/types.gguf          one 512x2 tensor of each supported type
                                          (F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q4_K Q5_K Q6_K),
                                          metadata of every value type, alignment 64
  tests/fixtures/gguf/types.expected.bin  expected float32 dequantisation, computed
                                          by gguf-py's independent numpy dequantiser
  fuzz/corpus/gguf/*                      small valid files plus truncated copies

types.expected.bin format (little endian), one record per tensor, in file order:
  u32 magic "AKVX" (0x58564b41) once at the start, u32 record count, then per record:
  u32 name_len, name bytes (UTF-8), u64 count, count x float32
"""
from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "gguf"
CORPUS = ROOT / "fuzz" / "corpus" / "gguf"

ROWS, COLS = 2, 512
QUANT_TYPES = [QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def random_halfs(rng: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    """Finite fp16 scale values as raw little-endian bytes (n x 2)."""
    vals = rng.uniform(lo, hi, size=n).astype(np.float16)
    return vals.view(np.uint8).reshape(n, 2)


def quant_blocks(rng: np.random.Generator, qtype: QT) -> np.ndarray:
    """Random raw blocks for a row-major ROWS x COLS tensor, with sane f16 scales.

    The quantised payload is random bytes; only the f16 d/dmin fields are
    replaced by finite values so no inf/NaN appears in the expected output.
    """
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if qtype in (QT.Q8_0, QT.Q4_0):
        raw[:, 0:2] = random_halfs(rng, n_blocks, -0.1, 0.1)
    elif qtype == QT.Q4_1:
        raw[:, 0:2] = random_halfs(rng, n_blocks, 0.0, 0.1)
        raw[:, 2:4] = random_halfs(rng, n_blocks, -1.0, 1.0)
    elif qtype in (QT.Q4_K, QT.Q5_K):
        raw[:, 0:2] = random_halfs(rng, n_blocks, 0.0, 0.01)
        raw[:, 2:4] = random_halfs(rng, n_blocks, 0.0, 0.01)
    elif qtype == QT.Q6_K:
        raw[:, 208:210] = random_halfs(rng, n_blocks, -0.01, 0.01)
    return raw.reshape(ROWS, -1)


def f16_tensor(rng: np.random.Generator) -> np.ndarray:
    """Random halves plus the special values the converter must get exactly right."""
    v = rng.standard_normal(ROWS * COLS).astype(np.float16).view(np.uint16)
    specials = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF,
                0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE55, 0x3C00, 0x3555]
    v[: len(specials)] = specials
    return v.reshape(ROWS, COLS)


def bf16_tensor(rng: np.random.Generator) -> np.ndarray:
    f = rng.standard_normal(ROWS * COLS).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).reshape(ROWS, COLS)


def add_metadata(w: gguf.GGUFWriter) -> None:
    """One key per GGUF value type, plus string and nested arrays."""
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo GGUF")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 2.718281828459045)
    w.add_array("test.array_str", ["a", "bc", "", "déf"])
    w.add_array("test.array_i32", [1, -2, 3])
    w.add_array("test.array_f32", [0.5, -1.25])
    w.add_array("test.array_nested", [[1, 2], [3], [4, 5, 6]])
    w.add_uint32("llama.block_count", 2)


def write_types_fixture(path: Path) -> list[tuple[str, np.ndarray]]:
    """Writes types.gguf; returns (name, expected float32) in tensor order."""
    rng = np.random.default_rng(20240601)
    w = gguf.GGUFWriter(str(path), "llama")
    add_metadata(w)
    expected: list[tuple[str, np.ndarray]] = []

    f32 = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    f32.reshape(-1)[:4] = [np.inf, -np.inf, -0.0, np.float32(1e-40)]
    w.add_tensor("t.f32", f32)
    expected.append(("t.f32", gguf.quants.dequantize(f32.view(np.uint8), QT.F32)))

    h = f16_tensor(rng)
    w.add_tensor("t.f16", h.view(np.float16))
    expected.append(("t.f16", gguf.quants.dequantize(h.view(np.uint8), QT.F16)))

    b = bf16_tensor(rng)
    w.add_tensor("t.bf16", b.view(np.uint8), raw_dtype=QT.BF16)
    expected.append(("t.bf16", gguf.quants.dequantize(b.view(np.uint8), QT.BF16)))

    for qt in QUANT_TYPES:
        raw = quant_blocks(rng, qt)
        name = "t." + qt.name.lower()
        w.add_tensor(name, raw, raw_dtype=qt)
        expected.append((name, gguf.quants.dequantize(raw, qt)))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, e in expected:
        assert e.dtype == np.float32 and e.size == ROWS * COLS, name
    return expected


def write_expected(path: Path, expected: list[tuple[str, np.ndarray]]) -> None:
    with open(path, "wb") as f:
        f.write(struct.pack("<II", 0x58564B41, len(expected)))
        for name, values in expected:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            flat = np.ascontiguousarray(values.reshape(-1), dtype="<f4")
            f.write(struct.pack("<Q", flat.size))
            f.write(flat.tobytes())


def write_small(path: Path, with_tensor: bool) -> None:
    """A tiny valid file (a few KVs, optionally one F32 tensor) for the fuzz corpus."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "b"])
    w.add_array("test.nested", [[1], [2, 3]])
    if with_tensor:
        w.add_tensor("w", np.arange(32, dtype=np.float32).reshape(1, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_corpus(types_path: Path) -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    write_small(CORPUS / "small_meta.gguf", with_tensor=False)
    write_small(CORPUS / "small_tensor.gguf", with_tensor=True)
    data = types_path.read_bytes()
    (CORPUS / "types.gguf").write_bytes(data)
    small = (CORPUS / "small_tensor.gguf").read_bytes()
    (CORPUS / "trunc_header.gguf").write_bytes(small[:20])
    (CORPUS / "trunc_meta.gguf").write_bytes(small[: len(small) // 2])
    (CORPUS / "trunc_types.gguf").write_bytes(data[:1500])


def main() -> int:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    types_path = FIXTURES / "types.gguf"
    expected = write_types_fixture(types_path)
    write_expected(FIXTURES / "types.expected.bin", expected)
    write_corpus(types_path)
    print(f"wrote {types_path} ({os.path.getsize(types_path)} bytes), "
          f"{len(expected)} expected tensors, corpus in {CORPUS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
