// Head shards: the split of KV heads over shards and each shard's byte
// ranges of a stored page. See include/activekv/kv/head_shard.h.
#include "activekv/kv/head_shard.h"

#include <cstring>
#include <string>

#include "activekv/core/error.h"
#include "activekv/kv/int8s_layout.h"

namespace activekv::kv {

std::vector<HeadRange> split_heads(int n_kv_heads, int n_shards) {
  if (n_shards < 1 || n_shards > n_kv_heads)
    throw InvalidArgument("head shards: " + std::to_string(n_shards) + " shards for " + std::to_string(n_kv_heads) +
                          " KV heads (each shard needs at least one head: 1.." + std::to_string(n_kv_heads) + ")");
  std::vector<HeadRange> out;
  const int base = n_kv_heads / n_shards, extra = n_kv_heads % n_shards;
  for (int i = 0, h = 0; i < n_shards; ++i) {
    const int n = base + (i < extra ? 1 : 0);
    out.push_back({h, n});
    h += n;
  }
  return out;
}

namespace {

constexpr size_t kHeaderBytes = kInt8sPayloadOffset;  // the codec header (activekv/kv/codec.h), 64 bytes

// The lossless13 planes [p0, p1) of a blob: [dir[p0], dir[p1]) from the payload start.
ByteRange lossless13_planes(const std::byte* blob, size_t blob_bytes, int page_heads, int p0, int p1) {
  const size_t payload = blob_bytes - kHeaderBytes;
  auto at = [&](int p) -> size_t {
    if (p == 2 * page_heads) return payload;
    uint32_t off;
    std::memcpy(&off, blob + kHeaderBytes + 4 * size_t(p), 4);
    return off;
  };
  const size_t a = at(p0), b = at(p1);
  if (a > b || b > payload || a < 8 * size_t(page_heads))
    throw InvalidArgument("head shards: lossless13 directory: planes " + std::to_string(p0) + ".." +
                          std::to_string(p1) + " at [" + std::to_string(a) + ", " + std::to_string(b) +
                          ") not ascending within the payload of " + std::to_string(payload) + " bytes");
  return {kHeaderBytes + a, b - a};
}

}  // namespace

std::vector<ByteRange> shard_byte_ranges(StoredPageKind kind, const std::byte* blob, size_t page_bytes,
                                         int page_heads, int page_size, int head_dim, HeadRange r) {
  if (r.head0 < 0 || r.heads < 1 || r.head0 + r.heads > page_heads)
    throw InvalidArgument("head shards: heads [" + std::to_string(r.head0) + ", " + std::to_string(r.head0 + r.heads) +
                          ") outside a page of " + std::to_string(page_heads));
  if (r.heads == page_heads) return {{0, page_bytes}};
  std::vector<ByteRange> out;
  switch (kind) {
    case StoredPageKind::bf16: {
      const size_t plane = size_t(page_size) * size_t(head_dim) * 2;
      out = {{size_t(r.head0) * plane, size_t(r.heads) * plane},
             {size_t(page_heads + r.head0) * plane, size_t(r.heads) * plane}};
      break;
    }
    case StoredPageKind::int8s: {
      const Int8sSectionLayout lay{size_t(head_dim), size_t(page_size)};
      out = {{lay.head_offset(r.head0), size_t(r.heads) * lay.bytes()}};
      break;
    }
    case StoredPageKind::lossless13: {
      if (page_bytes < kHeaderBytes + 8 * size_t(page_heads))
        throw InvalidArgument("head shards: a lossless13 blob of " + std::to_string(page_bytes) +
                              " bytes has no room for its directory");
      out = {{0, kHeaderBytes + 8 * size_t(page_heads)},
             lossless13_planes(blob, page_bytes, page_heads, r.head0, r.head0 + r.heads),
             lossless13_planes(blob, page_bytes, page_heads, page_heads + r.head0, page_heads + r.head0 + r.heads)};
      break;
    }
  }
  for (const ByteRange& b : out)
    if (b.offset + b.bytes > page_bytes)
      throw InvalidArgument("head shards: range [" + std::to_string(b.offset) + ", " +
                            std::to_string(b.offset + b.bytes) + ") past the page's " + std::to_string(page_bytes) +
                            " bytes");
  return out;
}

void add_staged_copy(std::vector<StagedCopy>& plan, const std::byte* host, size_t stage, size_t bytes, bool strided,
                     size_t max_gap) {
  if (!plan.empty()) {
    StagedCopy& c = plan.back();
    const bool same_shift = host >= c.host && size_t(host - c.host) == stage - c.stage_off && stage >= c.stage_off;
    const size_t end = c.stage_off + c.pitch * (c.rows - 1) + c.width;  // past the last row
    if (same_shift && c.rows == 1 && stage >= end && stage - end < max_gap) {
      c.width = c.pitch = stage - c.stage_off + bytes;
      return;
    }
    if (strided && same_shift && bytes == c.width && stage >= end) {
      const size_t step = stage - c.stage_off;
      if (c.rows == 1) {
        c.pitch = step;
        c.rows = 2;
        return;
      }
      if (step == c.pitch * c.rows) {
        ++c.rows;
        return;
      }
    }
  }
  plan.push_back({host, stage, bytes, bytes, 1});
}

}  // namespace activekv::kv
