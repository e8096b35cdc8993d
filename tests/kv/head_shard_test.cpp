// Head shards on the CPU (issue 15): the head split for N = 1..4 over 4 and 8
// KV heads (uneven splits handled), and each shard's byte ranges of a stored
// page in every format: copied alone, they hold exactly the shard's heads.
#include <gtest/gtest.h>

#include <cstring>

#include "../codec/codec_test_util.h"
#include "activekv/core/error.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/head_shard.h"

namespace activekv {
namespace {

using kv::ByteRange;
using kv::HeadRange;
using kv::StoredPageKind;

TEST(HeadShard, SplitsFourAndEightHeads) {
  using V = std::vector<HeadRange>;
  EXPECT_EQ(kv::split_heads(4, 1), (V{{0, 4}}));
  EXPECT_EQ(kv::split_heads(4, 2), (V{{0, 2}, {2, 2}}));
  EXPECT_EQ(kv::split_heads(4, 3), (V{{0, 2}, {2, 1}, {3, 1}}));  // uneven: handled, the first shard one more
  EXPECT_EQ(kv::split_heads(4, 4), (V{{0, 1}, {1, 1}, {2, 1}, {3, 1}}));
  EXPECT_EQ(kv::split_heads(8, 1), (V{{0, 8}}));
  EXPECT_EQ(kv::split_heads(8, 2), (V{{0, 4}, {4, 4}}));
  EXPECT_EQ(kv::split_heads(8, 3), (V{{0, 3}, {3, 3}, {6, 2}}));
  EXPECT_EQ(kv::split_heads(8, 4), (V{{0, 2}, {2, 2}, {4, 2}, {6, 2}}));
  for (int heads : {1, 4, 5, 8, 24})
    for (int n = 1; n <= heads && n <= 6; ++n) {  // contiguous, in order, every head once, sizes within one
      const auto s = kv::split_heads(heads, n);
      ASSERT_EQ(int(s.size()), n);
      int next = 0, lo = heads, hi = 0;
      for (const auto& r : s) {
        EXPECT_EQ(r.head0, next);
        next += r.heads;
        lo = std::min(lo, r.heads);
        hi = std::max(hi, r.heads);
      }
      EXPECT_EQ(next, heads);
      EXPECT_LE(hi - lo, 1);
    }
}

TEST(HeadShard, RefusesShardsWithoutHeads) {
  EXPECT_THROW(kv::split_heads(4, 0), InvalidArgument);
  EXPECT_THROW(kv::split_heads(4, 5), InvalidArgument);
  EXPECT_THROW(kv::split_heads(8, 9), InvalidArgument);
  EXPECT_THROW(kv::shard_byte_ranges(StoredPageKind::bf16, nullptr, 4096, 4, 4, 64, {3, 2}), InvalidArgument);
  EXPECT_THROW(kv::shard_byte_ranges(StoredPageKind::bf16, nullptr, 4096, 4, 4, 64, {0, 0}), InvalidArgument);
}

// Copies the shard's ranges of `page` into a buffer of 0xAA bytes, as a
// staging slot receives them.
std::vector<std::byte> staged(const std::vector<std::byte>& page, const std::vector<ByteRange>& ranges) {
  std::vector<std::byte> out(page.size(), std::byte{0xAA});
  size_t end = 0;
  for (const ByteRange& r : ranges) {
    EXPECT_GE(r.offset, end) << "ranges ascending and disjoint";
    EXPECT_LE(r.offset + r.bytes, page.size());
    std::memcpy(out.data() + r.offset, page.data() + r.offset, r.bytes);
    end = r.offset + r.bytes;
  }
  return out;
}

// [begin, end) of each region of a page (a plane or a head's section) and
// the head it belongs to; checks that a staged copy holds the regions of
// the shard's heads and none of the others'.
struct Region { size_t begin, end; int head; };
void expect_only_shard(const std::vector<std::byte>& page, const std::vector<std::byte>& got,
                       const std::vector<Region>& regions, HeadRange r) {
  for (const Region& g : regions) {
    const bool mine = g.head >= r.head0 && g.head < r.head0 + r.heads;
    if (mine)
      EXPECT_EQ(std::memcmp(got.data() + g.begin, page.data() + g.begin, g.end - g.begin), 0)
          << "head " << g.head << " of shard [" << r.head0 << ", " << r.head0 + r.heads << ") not copied";
    else
      for (size_t i = g.begin; i < g.end; ++i) ASSERT_EQ(got[i], std::byte{0xAA}) << "head " << g.head << " copied";
  }
}

std::vector<std::byte> as_bytes(const std::vector<bf16>& v) {
  std::vector<std::byte> b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(HeadShard, Bf16RangesHoldExactlyTheShardsPlanes) {
  for (int heads : {4, 8}) {
    const kv::KvShape s = testing::codec_shape(16, heads, 64);
    const auto page = as_bytes(testing::random_page(s, 7));
    std::vector<Region> planes;
    for (int p = 0; p < 2 * heads; ++p) planes.push_back({p * s.plane_bytes(), (p + 1) * s.plane_bytes(), p % heads});
    for (int n = 1; n <= 4; ++n)
      for (const HeadRange& r : kv::split_heads(heads, n)) {
        const auto ranges = kv::shard_byte_ranges(StoredPageKind::bf16, page.data(), page.size(), heads, 16, 64, r);
        EXPECT_EQ(ranges.size(), n == 1 ? 1u : 2u);
        expect_only_shard(page, staged(page, ranges), planes, r);
      }
  }
}

// The heads [r.head0, r.head0 + r.heads) of a page as a page of their own.
std::vector<bf16> sub_page(const kv::KvShape& s, const std::vector<bf16>& page, HeadRange r) {
  std::vector<bf16> out;
  for (int kv = 0; kv < 2; ++kv)
    for (int h = r.head0; h < r.head0 + r.heads; ++h) {
      const auto* p = page.data() + (size_t(kv) * s.n_kv_heads + h) * s.plane_elements();
      out.insert(out.end(), p, p + s.plane_elements());
    }
  return out;
}

TEST(HeadShard, Int8sRangesAreTheSectionsOfTheShardsHeadsEncodedAlone) {
  for (int heads : {4, 8}) {
    const kv::KvShape s = testing::codec_shape(64, heads, 64);
    const auto bf = testing::random_page(s, 11);
    const auto blob = kv::encode_page(kv::CodecFormat::int8s, s, bf, 64).bytes;
    const kv::Int8sSectionLayout lay{64, 64};
    std::vector<Region> sections;
    for (int h = 0; h < heads; ++h) sections.push_back({lay.head_offset(h), lay.head_offset(h + 1), h});
    for (int n = 1; n <= 4; ++n)
      for (const HeadRange& r : kv::split_heads(heads, n)) {
        const auto ranges = kv::shard_byte_ranges(StoredPageKind::int8s, blob.data(), blob.size(), heads, 64, 64, r);
        ASSERT_EQ(ranges.size(), 1u);
        expect_only_shard(blob, staged(blob, ranges), sections, r);
        if (n == 1) continue;
        // The codec is per head: the shard's bytes are what encoding its heads alone gives.
        const kv::KvShape ss = testing::codec_shape(64, r.heads, 64);
        const auto alone = kv::encode_page(kv::CodecFormat::int8s, ss, sub_page(s, bf, r), 64).bytes;
        ASSERT_EQ(alone.size() - kv::kCodecHeaderBytes, ranges[0].bytes);
        EXPECT_EQ(std::memcmp(alone.data() + kv::kCodecHeaderBytes, blob.data() + ranges[0].offset, ranges[0].bytes), 0);
      }
  }
}

TEST(HeadShard, Lossless13RangesAreHeaderDirectoryAndTheShardsPlanes) {
  for (int heads : {4, 8}) {
    const kv::KvShape s = testing::codec_shape(32, heads, 64);
    auto bf = testing::random_page(s, 13);
    for (size_t i = 0; i < s.plane_elements(); ++i) bf[3 * s.plane_elements() + i] = bf16{uint16_t(i * 2654435761u)};  // a raw plane
    const auto blob = kv::encode_page(kv::CodecFormat::lossless13, s, bf, 32).bytes;
    std::vector<Region> planes;
    for (int p = 0; p < 2 * heads; ++p) {
      uint32_t a, b = uint32_t(blob.size() - 64);
      std::memcpy(&a, blob.data() + 64 + 4 * p, 4);
      if (p + 1 < 2 * heads) std::memcpy(&b, blob.data() + 64 + 4 * (p + 1), 4);
      planes.push_back({64 + size_t(a), 64 + size_t(b), p % heads});
    }
    for (int n = 1; n <= 4; ++n)
      for (const HeadRange& r : kv::split_heads(heads, n)) {
        const auto ranges =
            kv::shard_byte_ranges(StoredPageKind::lossless13, blob.data(), blob.size(), heads, 32, 64, r);
        ASSERT_EQ(ranges.size(), n == 1 ? 1u : 3u);
        const auto got = staged(blob, ranges);
        EXPECT_EQ(std::memcmp(got.data(), blob.data(), 64 + 8 * size_t(heads)), 0) << "header and directory";
        expect_only_shard(blob, got, planes, r);
      }
    auto bad = blob;  // plane 1 said to start before plane 0
    const uint32_t back = 0;
    std::memcpy(bad.data() + 64 + 4, &back, 4);
    EXPECT_THROW(kv::shard_byte_ranges(StoredPageKind::lossless13, bad.data(), bad.size(), heads, 32, 64, {1, 1}),
                 InvalidArgument);
  }
}

}  // namespace
}  // namespace activekv
