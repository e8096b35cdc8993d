// Byte-pair merges by rank. A word starts as one symbol per byte; the
// adjacent pair with the lowest merge rank (leftmost on ties) is merged until
// no pair has a merge. Pairs live in a min-heap over a doubly linked list of
// symbols, so a word of n bytes costs O(n log n).
#include <algorithm>

#include <fmt/format.h>

#include "internal.h"

namespace activekv::tok {

namespace {

struct Sym {
  int32_t id;    // -1 once merged into its left neighbour
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
};

struct Cand {
  int32_t rank;
  int32_t left;   // symbol index
  int32_t right;  // symbol index
  int32_t left_id, right_id, merged_id;
};

// Min-heap order: lower rank first, then the leftmost pair.
struct CandGreater {
  bool operator()(const Cand& a, const Cand& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

}  // namespace

Bpe::Bpe(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
         int32_t unk_id)
    : unk_id_(unk_id) {
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(tokens.size() * 2);
  // The first occurrence of a duplicated text wins.
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int32_t>(i));

  byte_id_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
    if (auto it = ids.find(s); it != ids.end()) byte_id_[b] = it->second;
  }

  merges_.reserve(merges.size() * 2);
  std::string joined;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);  // the left part is never empty
    if (sp == std::string::npos || sp + 1 >= m.size())
      throw InvalidArgument(fmt::format("tokenizer: merge {} '{}' is not 'left right'", r, m));
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    joined.assign(left).append(right);
    auto l = ids.find(left), rt = ids.find(right), j = ids.find(joined);
    if (l == ids.end() || rt == ids.end() || j == ids.end())
      throw InvalidArgument(fmt::format(
          "tokenizer: merge {} '{}' names a token that is not in the vocabulary", r, m));
    // A repeated pair keeps its first (lowest) rank.
    merges_.emplace(key(l->second, rt->second), Merge{static_cast<int32_t>(r), j->second});
  }
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  const size_t n = word.size();
  if (n == 0) return;
  auto byte_token = [&](unsigned char b) {
    const int32_t id = byte_id_[b];
    if (id >= 0) return id;
    if (unk_id_ >= 0) return unk_id_;
    throw Error(fmt::format("tokenizer: byte 0x{:02x} has no token and there is no unknown token",
                            static_cast<unsigned>(b)));
  };
  if (n == 1) {
    out.push_back(byte_token(static_cast<unsigned char>(word[0])));
    return;
  }

  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;
  syms.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    syms[i] = {byte_token(static_cast<unsigned char>(word[i])), static_cast<int32_t>(i) - 1,
               i + 1 < n ? static_cast<int32_t>(i + 1) : -1};
  }
  auto push_pair = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    if (const Merge* m = find(syms[l].id, syms[r].id)) {
      heap.push_back({m->rank, l, r, syms[l].id, syms[r].id, m->id});
      std::push_heap(heap.begin(), heap.end(), CandGreater{});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), CandGreater{});
    const Cand c = heap.back();
    heap.pop_back();
    Sym& l = syms[c.left];
    Sym& r = syms[c.right];
    // Skip pairs made stale by an earlier merge.
    if (l.id != c.left_id || r.id != c.right_id || l.next != c.right) continue;
    l.id = c.merged_id;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = c.left;
    r.id = -1;
    push_pair(l.prev, c.left);
    push_pair(c.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace activekv::tok
