#!/usr/bin/env python3
"""Write tests/golden/gemma3_tokens.json: reference token ids for the C++
SentencePiece-style tokenizer (Gemma 3 270M's GGUF vocabulary).

The reference is Hugging Face transformers' own conversion of the GGUF
tokenizer (AutoTokenizer.from_pretrained(..., gguf_file=...): a `tokenizers`
BPE with byte fallback built from the GGUF tokens and scores, normalizer
' ' -> U+2581, CONTROL/USER_DEFINED tokens as added tokens), i.e. what
transformers runs for this file. Texts: the SmolLM2 golden texts (ASCII,
Latin accents, CJK, emoji/ZWJ, code, digits, whitespace runs, ChatML text that
is *not* special for Gemma), Gemma's own special tokens, and the opening 2000
bytes of each text in data/texts (the same files as ../shared/data), plus
whole-corpus FNV-1a hashes of the ids as for SmolLM2.

The chat expectation is Gemma's turn format (google/gemma-3-270m-it's
template, which this GGUF does not carry) written out by hand, without the
template's leading BOS (the engine adds BOS when encoding).

Usage (needs transformers>=5, tokenizers, gguf):
    python3 tools/reference_tokens_gemma3.py [--model models/gemma-3-270m-q4_k_m.gguf]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_tokens import ROOT, TEXTS, corpus_hashes, encode_cases, golden_texts, write_golden  # noqa: E402

GEMMA_TEXTS = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text between<eos> specials<pad><unk>",
    "two  spaces, three   spaces,\ttab\t\ttabs\n\nnewlines\n\n\n\rCR\r\n",
    " leading space and trailing space ",
    "\u2581 the marker itself \u2581\u2581",
    "Ünïcödé, Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย",
    "bytes: \x01\x02\x7f and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "gemma3_tokens.json"))
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"model not found: {args.model} (run scripts/setup.sh --gemma3)", file=sys.stderr)
        return 1

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(args.model)),
                                        gguf_file=os.path.basename(args.model))
    texts = golden_texts(ROOT) + GEMMA_TEXTS
    for name in ("pride-and-prejudice.txt", "tinyshakespeare.txt", "wikitext2-test.raw"):
        with open(os.path.join(TEXTS, name), "rb") as f:
            texts.append(f.read(2000).decode("utf-8", errors="ignore"))

    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    cases = encode_cases(texts, encode, lambda ids: tok.decode(ids, skip_special_tokens=False))
    corpora = corpus_hashes(encode)

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    chat = f"<start_of_turn>user\n{msgs[0]['content']}<end_of_turn>\n<start_of_turn>model\n"
    out = {
        "model": os.path.basename(args.model),
        "reference": (f"transformers {transformers.__version__} (tokenizers {tokenizers.__version__}) "
                      f"AutoTokenizer from the GGUF: {type(tok).__name__}, add_special_tokens=False"),
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "chat": {"messages": msgs, "add_generation_prompt": True, "expected": chat,
                 "expected_ids_with_bos": tok.encode(chat, add_special_tokens=True)},
        "cases": cases,
        "corpora": corpora,
    }
    write_golden(args.out, out)
    for c in corpora:
        print(c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
