#!/usr/bin/env python3
"""Write tests/golden/smollm2_tokens.json: reference token ids for the C++ tokenizer test.

The reference is built with the Hugging Face `tokenizers` library directly from the
GGUF vocabulary and merges, configured like SmolLM2's own tokenizer.json:

    pre_tokenizer = Sequence([Digits(individual_digits=True),
                              ByteLevel(add_prefix_space=False, use_regex=True)])
    decoder       = ByteLevel()
    special tokens = every CONTROL (3) / USER_DEFINED (4) token of the GGUF

Why not `transformers.AutoTokenizer.from_pretrained(..., gguf_file=...)`? Its GGUF
conversion for gpt2-type vocabularies installs a plain ByteLevel pre-tokenizer and
drops the Digits(individual_digits=True) step, so it differs from the real SmolLM2
tokenizer on texts such as "a   1" (whitespace before a digit). The script reports
how many golden texts that conversion gets right, for the record.

The chat-template expectation is rendered from the GGUF's tokenizer.chat_template
with jinja2 (the same engine transformers uses for apply_chat_template).

Usage: python3 tools/reference_tokens.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = os.path.join(ROOT, "data", "texts")  # the corpora shipped in the tree


def load_gguf_vocab(path: str):
    from gguf import GGUFReader

    r = GGUFReader(path)

    def field(name, default=None):
        f = r.fields.get(name)
        return f.contents() if f is not None else default

    return {
        "tokens": field("tokenizer.ggml.tokens"),
        "token_type": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos": field("tokenizer.ggml.bos_token_id"),
        "eos": field("tokenizer.ggml.eos_token_id"),
        "pre": field("tokenizer.ggml.pre"),
        "chat_template": field("tokenizer.chat_template"),
    }


def build_reference(v):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(v["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in v["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                           single_word=False)
                for t, ty in zip(v["tokens"], v["token_type"]) if ty in (3, 4)]
    tok.add_special_tokens(specials)
    return tok


def fnv1a64_ids(ids) -> str:
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def golden_texts(root: str):
    with open(os.path.join(TEXTS, "pride-and-prejudice.txt"), encoding="utf-8", newline="") as f:
        pp = f.read()
    # The first paragraphs of chapter 1 (CRLF line endings kept as in the file).
    start = pp.index("It is a truth universally acknowledged")
    end = start
    for _ in range(4):
        end = pp.index("\r\n\r\n", end) + 4
    prose = pp[start:end]
    return [
        "Hello world",
        "Café, naïve résumé — Ærøskøbing; ÀÉÎÕÜ ß ﬁ",
        "日本語のテキストと中文字符，한국어 텍스트도。",
        "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✨!",
        "def f(x):\n    if x > 1:\n\treturn x * 2  # tab\n    return {'a': [1, 2]}\n",
        "1234567 and 3.14 and -0.5e10 and 2024-01-31, a   1, x1y22z333",
        "trailing spaces   ",
        "\n\n\n",
        "   x",
        "a  b   c\t\td \n \n  e  \r\n",
        "I'm sure you'll see they've said it's what we'd do; DON'T 'quote' O'Neil's",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>assistant\nOK<|endoftext|><file_sep>x",
        "Zero\u00a0width\u200bspace and nbsp; math ∑∫√ ≠ ≤; arrows →⇒; symbols ©®™ ½",
        "\ufeffBOM at start, ${PATH}/usr/bin && echo \"done\" || exit 1;;",
        prose,
    ] + random_texts()


def random_texts(n: int = 4, length: int = 300, seed: int = 1234):
    """Deterministic random mixes of the character classes the regex cares about."""
    import random

    rng = random.Random(seed)
    pools = [
        "abcXYZ", "'sStTrevmld", "0123456789", "\u0663\u00bd\u2163",  # digits, ½, roman IV
        " ", "  ", "\t", "\n", "\r\n", "\u00a0\u3000\u2009", "\u200b\ufeff",
        ".,;:!?-_()[]{}<>\"#$%&*+/=@\\^`|~", "éàçøßÆ", "日本語中文한국어", "😀👍🏽🇫🇷✨",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<|im_", "\u0301\u0308",
    ]
    out = []
    for _ in range(n):
        parts = []
        while sum(len(p) for p in parts) < length:
            pool = rng.choice(pools)
            parts.append(pool if pool.startswith("<") else
                         "".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def encode_cases(texts, encode, decode):
    """[{"text", "ids"}] for each text, warning when the reference does not round-trip."""
    cases = []
    for text in texts:
        ids = encode(text)
        if decode(ids) != text:
            print(f"warning: reference does not round-trip {text[:40]!r}", file=sys.stderr)
        cases.append({"text": text, "ids": ids})
    return cases


def corpus_hashes(encode):
    """Whole-corpus checks: token count and an FNV-1a hash of the ids (as
    little-endian int32), so the C++ tests can compare long encodings cheaply."""
    corpora = []
    for name, limit in (("pride-and-prejudice.txt", None), ("tinyshakespeare.txt", 20000),
                        ("wikitext2-test.raw", None)):
        with open(os.path.join(TEXTS, name), "rb") as f:
            raw = f.read()
        if limit is not None:
            raw = raw[:limit]
        ids = encode(raw.decode("utf-8"))
        corpora.append({"file": name, "bytes": len(raw), "n_tokens": len(ids), "fnv1a64": fnv1a64_ids(ids)})
    return corpora


def write_golden(path, out):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(out['cases'])} cases to {path}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden", "smollm2_tokens.json"))
    args = ap.parse_args()
    if not os.path.exists(args.model):
        print(f"model not found: {args.model} (run setup)", file=sys.stderr)
        return 1

    import jinja2
    import tokenizers

    v = load_gguf_vocab(args.model)
    ref = build_reference(v)

    encode = lambda text: ref.encode(text, add_special_tokens=False).ids  # noqa: E731
    cases = encode_cases(golden_texts(ROOT), encode, lambda ids: ref.decode(ids, skip_special_tokens=False))

    # Chat template: render the model's own template with jinja2.
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    tmpl = env.from_string(v["chat_template"])
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = tmpl.render(messages=messages, add_generation_prompt=True,
                       bos_token=v["tokens"][v["bos"]], eos_token=v["tokens"][v["eos"]])
    chat_no_gen = tmpl.render(messages=messages, add_generation_prompt=False,
                              bos_token=v["tokens"][v["bos"]], eos_token=v["tokens"][v["eos"]])

    # For the record: does transformers' own GGUF conversion agree?
    hf_note = None
    try:
        import transformers
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(os.path.dirname(args.model),
                                          gguf_file=os.path.basename(args.model))
        agree = sum(1 for c in cases
                    if t.encode(c["text"], add_special_tokens=False) == c["ids"])
        hf_chat = t.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        hf_note = (f"transformers {transformers.__version__} GGUF conversion: pre_tokenizer "
                   f"{t.backend_tokenizer.pre_tokenizer.__getstate__().decode()} (no Digits step); "
                   f"agrees on {agree}/{len(cases)} texts; chat template "
                   f"{'matches' if hf_chat == chat else 'DIFFERS'}")
        print(hf_note)
    except Exception as e:  # transformers is optional here
        hf_note = f"transformers check skipped: {e}"

    corpora = corpus_hashes(encode)

    out = {
        "model": os.path.basename(args.model),
        "reference": (f"tokenizers {tokenizers.__version__}: BPE from GGUF vocab+merges, "
                      "pre_tokenizer Sequence([Digits(individual_digits=True), "
                      "ByteLevel(add_prefix_space=False, use_regex=True)]), decoder ByteLevel, "
                      "CONTROL/USER_DEFINED tokens added as special tokens"),
        "chat_reference": f"jinja2 {jinja2.__version__} rendering of tokenizer.chat_template",
        "transformers_note": hf_note,
        "chat": {"messages": messages, "add_generation_prompt": True, "expected": chat,
                 "expected_no_generation_prompt": chat_no_gen},
        "cases": cases,
        "corpora": corpora,
    }
    write_golden(args.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
