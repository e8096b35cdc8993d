// Head shards (issue 15): the history splits cleanly by KV head, so N GPUs
// each stream and attend their own heads' bytes of every page over their own
// link. This file is the host-side arithmetic of that split, shared by the
// GPU engine (src/cuda/decode_engine.cpp, sharded_engine.cpp) and its CPU
// tests: which heads each shard gets, and which byte ranges of a stored page
// (bf16, int8s or lossless13, as the one page store holds it) are one
// shard's. No GPU code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace activekv::kv {

/// KV heads [head0, head0 + heads) of the model's n_kv_heads.
struct HeadRange {
  int head0 = 0;
  int heads = 0;
  bool operator==(const HeadRange&) const = default;
};

/// Splits n_kv_heads over n_shards as evenly as heads allow: contiguous
/// ranges in head order, the first n_kv_heads % n_shards shards one head
/// more (an uneven split is handled, not refused: 6 heads over 4 shards ->
/// 2, 2, 1, 1; a step then takes as long as its largest shard). Throws
/// InvalidArgument when n_shards < 1 or n_shards > n_kv_heads (a shard would
/// have no head).
std::vector<HeadRange> split_heads(int n_kv_heads, int n_shards);

/// How a stored page is laid out, for range arithmetic.
enum class StoredPageKind : uint8_t { bf16, int8s, lossless13 };

/// One byte range of a stored page: [offset, offset + bytes) from its start.
struct ByteRange {
  size_t offset = 0;
  size_t bytes = 0;
  bool operator==(const ByteRange&) const = default;
};

/// The byte ranges of one stored page a shard of heads `r` reads, in
/// ascending order, disjoint; a reader that copies them to the same offsets
/// of a page-sized buffer may read the shard's heads there as in the page:
///   bf16 (page_heads K planes, then page_heads V planes, each page_size x
///     head_dim bf16): the shard's K planes and its V planes (2 ranges);
///   int8s (64-byte header, then one section per head, activekv/kv/int8s_layout.h):
///     the shard's sections (1 range; the kernel reads no header);
///   lossless13 (64-byte header, directory of 2 page_heads u32 plane offsets,
///     planes K0..K(H-1), V0..V(H-1) back to back, codec_lossless13.h):
///     header and directory, the shard's K planes, its V planes (3 ranges,
///     from the directory in `blob`, which must hold `page_bytes` bytes).
/// A shard of every head reads the whole page: one range [0, page_bytes).
/// page_bytes is the page's (bf16) or blob's (codecs) size.
/// Throws InvalidArgument for a range outside the page, and for a lossless13
/// directory that is not ascending within the payload (naming the plane).
std::vector<ByteRange> shard_byte_ranges(StoredPageKind kind, const std::byte* blob, size_t page_bytes,
                                         int page_heads, int page_size, int head_dim, HeadRange r);

/// One host -> device copy of a staging plan: `rows` rows of `width` bytes,
/// `pitch` bytes apart in host memory and in the staging slot alike, the
/// first from `host` to slot offset `stage_off` (rows == 1: a plain copy,
/// pitch == width). The GPU engine issues it as cudaMemcpyAsync or
/// cudaMemcpy2DAsync.
struct StagedCopy {
  const std::byte* host = nullptr;
  size_t stage_off = 0, width = 0, pitch = 0, rows = 1;
  size_t bytes() const { return width * rows; }
};

/// Adds the host bytes [host, host + bytes), staged at slot offset `stage`
/// (stage offsets ascending), to a plan. A range that lies, in host memory
/// as in the slot, right after the last copy -- but for a gap under
/// `max_gap` bytes (the padding between staged pages) -- extends that copy
/// (a run of adjacent whole pages is ONE copy, padding included). With
/// `strided`, a range of the last copy's width one step further (in host
/// memory and slot alike, the same step as its rows) becomes one more row of
/// a 2D copy: a head shard's K and V ranges page after page. Else it starts
/// a new copy.
void add_staged_copy(std::vector<StagedCopy>& plan, const std::byte* host, size_t stage, size_t bytes, bool strided,
                     size_t max_gap);

}  // namespace activekv::kv
