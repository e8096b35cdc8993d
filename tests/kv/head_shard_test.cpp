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

namespace activekv {
namespace {

// Runs a staging plan as the GPU engine's copies would (row by row) from
// `host` into `slot`.
void run_plan(const std::vector<kv::StagedCopy>& plan, std::byte* slot) {
  for (const kv::StagedCopy& c : plan)
    for (size_t r = 0; r < c.rows; ++r) std::memcpy(slot + c.stage_off + r * c.pitch, c.host + r * c.pitch, c.width);
}

// n pages of `page_bytes` each, `stride` apart in host memory and staged
// `stage_stride` apart (the engine's 256-byte aligned slots): every shard's
// ranges planned page by page, run, and checked -- the shard's bytes are
// staged, nothing else is (but the padding a whole-page run carries along).
struct StagingCase {
  kv::StoredPageKind kind;
  std::vector<std::byte> host;  // the pages back to back (`stride` apart)
  size_t page_bytes, stride, n;
  int heads, page_size, head_dim;

  std::vector<kv::StagedCopy> plan(HeadRange r, bool strided, const std::vector<size_t>& skip = {}) const {
    std::vector<kv::StagedCopy> out;
    size_t stage = 0;
    for (size_t p = 0; p < n; ++p) {
      if (std::find(skip.begin(), skip.end(), p) != skip.end()) continue;  // not in this job: a hole in the run
      const std::byte* page = host.data() + p * stride;
      for (const ByteRange& b :
           kv::shard_byte_ranges(kind, page, page_bytes, heads, page_size, head_dim, r))
        kv::add_staged_copy(out, page + b.offset, stage + b.offset, b.bytes, strided, 256);
      stage += (page_bytes + 255) / 256 * 256;
    }
    return out;
  }
  void check(HeadRange r, bool strided) const {
    const auto cps = plan(r, strided);
    const size_t slot_stride = (page_bytes + 255) / 256 * 256;
    std::vector<std::byte> slot(n * slot_stride, std::byte{0xAA});
    run_plan(cps, slot.data());
    for (size_t p = 0; p < n; ++p) {
      const std::byte* page = host.data() + p * stride;
      std::vector<std::byte> want(page_bytes, std::byte{0xAA});
      for (const ByteRange& b : kv::shard_byte_ranges(kind, page, page_bytes, heads, page_size, head_dim, r))
        std::memcpy(want.data() + b.offset, page + b.offset, b.bytes);
      ASSERT_EQ(std::memcmp(slot.data() + p * slot_stride, want.data(), page_bytes), 0)
          << "page " << p << " of shard [" << r.head0 << ", " << r.head0 + r.heads << ")" << (strided ? " 2D" : "");
    }
  }
};

TEST(StagedCopies, Bf16ShardsTwoCopiesPerPageOrOne2DCopyPerRun) {
  const int heads = 4, ps = 16, hd = 64;
  const kv::KvShape s = testing::codec_shape(ps, heads, hd);
  StagingCase c{kv::StoredPageKind::bf16, {}, s.page_bytes(), s.page_bytes(), 5, heads, ps, hd};
  for (size_t p = 0; p < c.n; ++p) {
    const auto b = as_bytes(testing::random_page(s, uint32_t(p)));
    c.host.insert(c.host.end(), b.begin(), b.end());
  }
  for (int n = 1; n <= 4; ++n)
    for (const HeadRange& r : kv::split_heads(heads, n))
      for (const bool strided : {false, true}) {
        c.check(r, strided);
        const auto cps = c.plan(r, strided);
        size_t rows = 0, bytes = 0;
        for (const auto& cp : cps) rows += cp.rows, bytes += cp.bytes();
        if (n == 1) {  // the whole run of adjacent pages: one copy
          EXPECT_EQ(cps.size(), 1u);
          EXPECT_EQ(bytes, c.n * c.page_bytes);
          continue;
        }
        EXPECT_EQ(rows, 2 * c.n) << "a K and a V range per page";
        EXPECT_EQ(bytes, 2 * c.n * s.plane_bytes() * size_t(r.heads)) << "the shard's bytes, nothing more";
        EXPECT_EQ(cps.size(), strided ? 1u : 2 * c.n);
        if (strided) EXPECT_EQ(cps[0].pitch, c.page_bytes / 2) << "K, V, next page's K: half a page apart";
      }
  // A page missing from the job (another tile, or resident): the 2D copy stops there and goes on after it.
  const auto cps = c.plan({0, 2}, true, {2});
  ASSERT_EQ(cps.size(), 2u);
  EXPECT_EQ(cps[0].rows, 4u);
  EXPECT_EQ(cps[1].rows, 4u);
}

TEST(StagedCopies, Int8sBlobsWithPaddingWholeRunsAndShardSections) {
  const int heads = 4, ps = 64, hd = 64;
  const kv::KvShape s = testing::codec_shape(ps, heads, hd);
  const size_t blob = kv::encoded_page_bytes(kv::CodecFormat::int8s, s), stride = (blob + 255) / 256 * 256;
  ASSERT_NE(blob % 256, 0u) << "the case needs padding between staged blobs";
  StagingCase c{kv::StoredPageKind::int8s, std::vector<std::byte>(4 * stride), blob, stride, 4, heads, ps, hd};
  for (size_t p = 0; p < c.n; ++p) {
    const auto e = kv::encode_page(kv::CodecFormat::int8s, s, testing::random_page(s, uint32_t(p + 10)), ps).bytes;
    std::memcpy(c.host.data() + p * stride, e.data(), e.size());
  }
  // Unsharded: one copy of the run, the padding between blobs carried along, never past the last blob.
  const auto whole = c.plan({0, heads}, false);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].bytes(), 3 * stride + blob);
  for (int n = 2; n <= 4; ++n)
    for (const HeadRange& r : kv::split_heads(heads, n))
      for (const bool strided : {false, true}) {
        c.check(r, strided);
        const auto cps = c.plan(r, strided);
        EXPECT_EQ(cps.size(), strided ? 1u : c.n) << "one range (the shard's sections) per blob";
      }
}

}  // namespace
}  // namespace activekv
