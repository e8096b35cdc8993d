// SentencePiece-style BPE over a GGUF vocabulary (llama.cpp's "llama"
// tokenizer model, e.g. Gemma 3). A fragment starts as one symbol per UTF-8
// character, spaces already replaced by U+2581; the adjacent pair of tokens
// whose concatenation is a token with the best merge rank is merged, until no
// pair forms a token. A final symbol that is no token (a character outside the
// vocabulary) falls back to its bytes' <0xNN> tokens.
//
// Merge rank: the merged token's score, higher first -- or, with
// rank_by_id (Gemma), its position in the vocabulary, lower first: Gemma's
// scores do not follow its merge order, its token order does (transformers'
// GGUF converter rebuilds Gemma's merges that way, and we match it). Ties:
// the longer left piece, then the longer right one (in code points), then the
// lower left id, right id -- transformers' generate_merges order -- and then
// the leftmost pair. Pairs live in a heap over a doubly linked list: O(n log n).
#include <algorithm>
#include <queue>

#include <fmt/format.h>

#include "internal.h"

namespace activekv::tok {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space marker

struct Sym {
  uint32_t begin, len;  // bytes of the symbol in the normalised text; len 0 once merged away
  int32_t prev, next;   // live neighbours, -1 at the ends
  int32_t id;           // its token, or -1 (a character outside the vocabulary)
  uint32_t chars;       // code points
};

struct Cand {
  float priority;                  // higher first
  uint32_t left_chars, right_chars;  // longer first
  int32_t left_id, right_id;       // lower first
  int32_t left, right;             // symbol indices; leftmost first
  uint32_t len;                    // bytes of the merged text, to detect stale candidates
  int32_t merged;                  // the token they form
};

// Max-heap order: the best candidate compares greatest.
struct CandLess {
  bool operator()(const Cand& a, const Cand& b) const {
    if (a.priority != b.priority) return a.priority < b.priority;
    if (a.left_chars != b.left_chars) return a.left_chars < b.left_chars;
    if (a.right_chars != b.right_chars) return a.right_chars < b.right_chars;
    if (a.left_id != b.left_id) return a.left_id > b.left_id;
    if (a.right_id != b.right_id) return a.right_id > b.right_id;
    return a.left > b.left;
  }
};

// Length of the UTF-8 sequence starting with byte c (1 for a stray byte).
uint32_t utf8_len(unsigned char c) {
  if (c >= 0xF0 && c <= 0xF4) return 4;
  if (c >= 0xE0) return 3;
  if (c >= 0xC2 && c < 0xE0) return 2;
  return 1;
}

}  // namespace

bool Spm::is_space_run(std::string_view t) {
  return t.find(' ') != std::string_view::npos && t.find_first_not_of(" \t\n\r\v\f") == std::string_view::npos;
}

Spm::Spm(const std::vector<std::string>& tokens, const std::vector<float>& scores,
         const std::vector<int32_t>& types, int32_t unk_id, bool rank_by_id)
    : unk_id_(unk_id) {
  if (scores.size() != tokens.size()) {
    throw InvalidArgument(fmt::format("tokenizer: {} scores for {} tokens", scores.size(), tokens.size()));
  }
  priority_.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) priority_[i] = rank_by_id ? -float(i) : scores[i];
  byte_id_.fill(-1);
  ids_.reserve(tokens.size() * 2);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto type = static_cast<TokenType>(types[i]);
    const std::string& t = tokens[i];
    if (type == TokenType::BYTE) {
      // "<0xNN>"
      unsigned v = 0;
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
          std::sscanf(t.c_str() + 3, "%2x", &v) == 1) {
        byte_id_[v] = int32_t(i);
      }
      continue;
    }
    // Merges and characters may become normal and user-defined tokens only
    // (control tokens are matched by the special-token split, not built). A
    // run of spaces ("  ", Gemma's user-defined whitespace tokens) is a
    // vocabulary entry spelled with U+2581, as the normalised text has it.
    if (is_space_run(t)) {
      std::string spelled;
      for (size_t k = 0; k < t.size(); ++k) spelled += kSpace;
      ids_.emplace(std::move(spelled), int32_t(i));
    } else if (type == TokenType::NORMAL || type == TokenType::USER_DEFINED) {
      ids_.emplace(t, int32_t(i));
    }
  }
}

std::string Spm::normalise(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ') out += kSpace;
    else out.push_back(c);
  }
  return out;
}

void Spm::encode_fragment(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  const std::string text = normalise(raw);
  auto id_of = [&](std::string_view s) {
    const auto it = ids_.find(s);
    return it == ids_.end() ? -1 : it->second;
  };
  std::vector<Sym> syms;
  for (uint32_t i = 0; i < text.size();) {
    const uint32_t n = std::min<uint32_t>(utf8_len(static_cast<unsigned char>(text[i])), uint32_t(text.size()) - i);
    syms.push_back({i, n, int32_t(syms.size()) - 1, int32_t(syms.size()) + 1, id_of({text.data() + i, n}), 1});
    i += n;
  }
  syms.back().next = -1;

  std::priority_queue<Cand, std::vector<Cand>, CandLess> heap;
  auto try_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Sym& a = syms[size_t(l)];
    const Sym& b = syms[size_t(r)];
    if (a.id < 0 || b.id < 0) return;  // merges join tokens only
    const std::string_view s(text.data() + a.begin, a.len + b.len);
    const int32_t merged = id_of(s);
    if (merged < 0) return;
    heap.push({priority_[size_t(merged)], a.chars, b.chars, a.id, b.id, l, r, uint32_t(s.size()), merged});
  };
  for (size_t i = 1; i < syms.size(); ++i) try_pair(int32_t(i) - 1, int32_t(i));

  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = syms[size_t(c.left)];
    Sym& r = syms[size_t(c.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != c.len || l.next != c.right) continue;  // stale
    l.len += r.len;
    l.chars += r.chars;
    l.id = c.merged;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[size_t(r.next)].prev = c.left;
    try_pair(l.prev, c.left);
    try_pair(c.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = syms[size_t(i)].next) {
    const Sym& sym = syms[size_t(i)];
    if (sym.id >= 0) {
      out.push_back(sym.id);
      continue;
    }
    const std::string_view s(text.data() + sym.begin, sym.len);
    for (unsigned char b : s) {  // byte fallback
      const int32_t id = byte_id_[b] >= 0 ? byte_id_[b] : unk_id_;
      if (id < 0) throw Error(fmt::format("tokenizer: byte 0x{:02X} has no <0x{:02X}> token and no unknown token", b, b));
      out.push_back(id);
    }
  }
}

std::string Spm::piece(std::string_view token, TokenType type) {
  if (type == TokenType::BYTE) {
    unsigned v = 0;
    if (token.size() == 6 && std::sscanf(std::string(token).c_str(), "<0x%2x>", &v) == 1) {
      return std::string(1, char(v));
    }
    return std::string(token);
  }
  std::string out;
  for (size_t i = 0; i < token.size();) {
    if (token.substr(i, kSpace.size()) == kSpace) {
      out.push_back(' ');
      i += kSpace.size();
    } else {
      out.push_back(token[i++]);
    }
  }
  return out;
}

}  // namespace activekv::tok
