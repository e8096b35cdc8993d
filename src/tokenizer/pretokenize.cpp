// The pre-tokenizer: the GPT-2 regex, written by hand over code points,
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// with alternatives tried in order at each position (as a backtracking engine
// does), optionally preceded by SmolLM's split of every \p{N} into its own piece
// (HF Digits(individual_digits=True)).
#include "internal.h"

namespace activekv::tok {

namespace {

using Range = std::pair<uint32_t, uint32_t>;

bool is_ascii(const CodePoint& c, char ch) { return c.cp == static_cast<uint32_t>(ch); }

// Length in code points of a contraction at cps[i] (which is '\''), or 0.
size_t contraction(const CodePoint* cps, size_t i, size_t n) {
  if (i + 1 >= n) return 0;
  const uint32_t c1 = cps[i + 1].cp;
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
    // 're / 've / 'll are tried before 'm and 'd but cannot overlap them.
    return 2;
  }
  if (i + 2 < n) {
    const uint32_t c2 = cps[i + 2].cp;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
      return 3;
  }
  return 0;
}

// Applies the GPT-2 regex to code points cps[0..n); emits byte ranges.
void gpt2_split(const CodePoint* cps, size_t n, uint32_t end_byte, std::vector<Range>& out) {
  auto byte_at = [&](size_t k) { return k < n ? cps[k].begin : end_byte; };
  size_t i = 0;
  while (i < n) {
    const CodePoint& c = cps[i];
    size_t j = i;  // end (exclusive, in code points) of the match
    if (is_ascii(c, '\'')) {
      j = i + contraction(cps, i, n);
    }
    if (j == i) {
      // " ?X+" for X in {L, N, Other}: optional leading ASCII space.
      size_t k = i;
      if (is_ascii(c, ' ') && i + 1 < n && cps[i + 1].cls != CharClass::Space) k = i + 1;
      const CharClass cls = cps[k].cls;
      if (cls != CharClass::Space) {
        j = k + 1;
        while (j < n && cps[j].cls == cls) ++j;
      }
    }
    if (j == i) {
      // Whitespace: \s+(?!\S) then \s+.
      size_t e = i + 1;
      while (e < n && cps[e].cls == CharClass::Space) ++e;
      if (e == n || e - i == 1) {
        j = e;  // run reaches the end, or a single space before non-space (\s+)
      } else {
        j = e - 1;  // leave the last space to prefix the next word
      }
    }
    out.emplace_back(byte_at(i), byte_at(j));
    i = j;
  }
}

}  // namespace

void pretokenize(std::string_view text, PreTokenizer kind, std::vector<CodePoint>& scratch,
                 std::vector<Range>& out) {
  decode_utf8(text, scratch);
  const CodePoint* cps = scratch.data();
  const size_t n = scratch.size();
  const auto end_byte = static_cast<uint32_t>(text.size());
  if (kind == PreTokenizer::Gpt2) {
    gpt2_split(cps, n, end_byte, out);
    return;
  }
  // SmolLM: every \p{N} code point is a piece; the runs between them are
  // split by the GPT-2 regex independently (lookahead stops at a digit).
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (cps[i].cls != CharClass::Number) continue;
    if (i > start) gpt2_split(cps + start, i - start, cps[i].begin, out);
    out.emplace_back(cps[i].begin, i + 1 < n ? cps[i + 1].begin : end_byte);
    start = i + 1;
  }
  if (start < n) gpt2_split(cps + start, n - start, end_byte, out);
}

}  // namespace activekv::tok
