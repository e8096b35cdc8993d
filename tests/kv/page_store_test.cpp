#include "activekv/kv/page_store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

namespace activekv {
namespace {

kv::KvShape shape(int page_size = 4, kv::PageFormat f = kv::PageFormat::bf16) {
  return {2, 2, 3, page_size, f};
}

// Value i of a plane, widened to fp32.
float at(kv::PageFormat f, const std::byte* plane, size_t i) {
  float out[8];
  kv::decode_elements(f, plane, i + 1, out);  // i < 8 in these tests
  return out[i];
}
float at(const std::byte* plane, size_t i) { return at(kv::PageFormat::bf16, plane, i); }

TEST(PageStore, RejectsBadShape) {
  EXPECT_THROW(kv::PageStore(kv::KvShape{0, 1, 1, 1}), InvalidArgument);
  EXPECT_THROW(kv::PageStore(kv::KvShape{1, 1, 1, 0}), InvalidArgument);
}

TEST(PageStore, AllocateReleaseReuse) {
  kv::PageStore s(shape(), 2);
  const kv::PageId a = s.allocate(), b = s.allocate();
  EXPECT_NE(a, b);
  EXPECT_THROW(s.allocate(), Error);  // pool full
  EXPECT_EQ(s.pages_in_use(), 2u);
  const float five = 5.0f;
  kv::encode_elements(kv::PageFormat::bf16, &five, 1, s.k_plane(a, 1), 0);
  EXPECT_EQ(at(s.k_plane(a, 1), 0), 5.0f);
  s.release(a);
  EXPECT_THROW(s.release(a), InvalidArgument);
  const kv::PageId c = s.allocate();
  EXPECT_EQ(c, a);
  EXPECT_EQ(at(s.k_plane(c, 1), 0), 0.0f);  // reused pages come back zeroed
}

class SequenceKvFormats : public ::testing::TestWithParam<kv::PageFormat> {};

TEST_P(SequenceKvFormats, WritesLandInHeadMajorPlanes) {
  const kv::PageFormat f = GetParam();
  kv::PageStore s(shape(4, f));
  kv::SequenceKv seq(s);
  const int n = 6;  // spans two pages
  std::vector<float> k(size_t(n) * 2 * 3), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = float(i);
    v[i] = -float(i);
  }
  seq.reserve(n);
  for (int l = 0; l < 2; ++l) seq.write(l, 0, n, k.data(), v.data());
  seq.commit(n);
  EXPECT_EQ(seq.n_tokens(), n);
  ASSERT_EQ(seq.page_table(1).size(), 2u);
  // token 5, head 1, dim 2 -> page 1, slot 1
  const kv::PageId p = seq.page_table(1)[1];
  EXPECT_EQ(at(f, s.k_plane(p, 1), 1 * 3 + 2), float(5 * 6 + 1 * 3 + 2));
  EXPECT_EQ(at(f, s.v_plane(p, 1), 1 * 3 + 2), -float(5 * 6 + 1 * 3 + 2));
}

INSTANTIATE_TEST_SUITE_P(Formats, SequenceKvFormats,
                         ::testing::Values(kv::PageFormat::bf16, kv::PageFormat::f32));

TEST(PageFormat, F32KeepsEveryBitAndBf16Rounds) {
  const float x = 1.0f + 0x1.0p-20f;
  std::byte plane[8];
  float back = 0;
  kv::encode_elements(kv::PageFormat::f32, &x, 1, plane, 1);
  kv::decode_elements(kv::PageFormat::f32, plane + 4, 1, &back);
  EXPECT_EQ(back, x);
  kv::encode_elements(kv::PageFormat::bf16, &x, 1, plane, 0);
  kv::decode_elements(kv::PageFormat::bf16, plane, 1, &back);
  EXPECT_EQ(back, 1.0f);
  EXPECT_EQ(kv::parse_page_format("f32"), kv::PageFormat::f32);
  EXPECT_THROW(kv::parse_page_format("int4"), InvalidArgument);
  EXPECT_EQ(shape(4, kv::PageFormat::f32).page_bytes(), 2 * shape(4).page_bytes());
}

TEST(SequenceKv, FullStoreLosesNothingAlreadyStored) {
  kv::PageStore s(shape(4), 4);  // two layers x two pages
  kv::SequenceKv seq(s);
  std::vector<float> k(8 * 6, 1.0f), v(8 * 6, 2.0f);
  seq.reserve(8);
  seq.write(0, 0, 8, k.data(), v.data());
  seq.write(1, 0, 8, k.data(), v.data());
  seq.commit(8);
  EXPECT_THROW(seq.reserve(1), Error);
  EXPECT_EQ(seq.n_tokens(), 8);
  EXPECT_EQ(seq.page_table(0).size(), 2u);
  EXPECT_EQ(s.pages_in_use(), 4u);
  EXPECT_EQ(at(s.v_plane(seq.page_table(1)[1], 0), 0), 2.0f);
}

TEST(SequenceKv, WriteOutsideReservedSpaceThrows) {
  kv::PageStore s(shape(4));
  kv::SequenceKv seq(s);
  std::vector<float> k(6 * 5);
  seq.reserve(3);
  EXPECT_THROW(seq.write(0, 2, 5, k.data(), k.data()), InvalidArgument);
  EXPECT_THROW(seq.write(2, 0, 1, k.data(), k.data()), InvalidArgument);
  EXPECT_THROW(seq.commit(5), InvalidArgument);
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNan) {
  EXPECT_EQ(f32_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808001u)).bits, 0x3f81);
  const bf16 nan = f32_to_bf16(std::bit_cast<float>(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
}

TEST(PageStore, BoundedStoreGivesEachLayerAdjacentPages) {
  kv::PageStore s(shape(4), 8);  // 2 layers: regions of 4 slots
  kv::SequenceKv seq(s);
  seq.reserve(4 * 3);  // three pages per layer, allocated page by page across layers
  for (int l = 0; l < 2; ++l) {
    const auto t = seq.page_table(l);
    ASSERT_EQ(t.size(), 3u);
    for (size_t p = 1; p < t.size(); ++p) {
      EXPECT_EQ(s.page_data(t[p]), s.page_data(t[p - 1]) + s.shape().page_bytes()) << "layer " << l;
    }
  }
}

TEST(PageStore, UnboundedStoreGrowsAndPagesNeverMove) {
  kv::PageStore s(shape(4));
  std::vector<kv::PageId> ids;
  std::vector<std::byte*> where;
  for (int i = 0; i < 100; ++i) {  // several slabs
    ids.push_back(s.allocate());
    where.push_back(s.page_data(ids.back()));
    *where.back() = std::byte(i);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(s.page_data(ids[i]), where[i]);
    EXPECT_EQ(*s.page_data(ids[i]), std::byte(i));
  }
  EXPECT_EQ(s.pages_in_use(), 100u);
  EXPECT_FALSE(s.pinned());
}

TEST(PageStore, BoundedStoreThatCannotFitSaysSo) {
  // 2^40 pages of 48 bytes: far beyond any machine.
  try {
    kv::PageStore s(shape(4), size_t(1) << 40);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit"), std::string::npos) << e.what();
  }
}

TEST(BlobArena, ReusesFreedRangesAndMergesNeighbours) {
  kv::BlobArena a(kv::plain_host_memory(), 0, 4096);
  const kv::Blob x = a.allocate(1000), y = a.allocate(1000), z = a.allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data) % kv::BlobArena::kAlign, 0u);
  EXPECT_EQ(y.data, x.data + 1024);
  EXPECT_EQ(a.bytes_reserved(), 4096u);
  a.release(x);
  a.release(y);
  const kv::Blob w = a.allocate(2000);  // fits only in the merged x+y range
  EXPECT_EQ(w.data, x.data);
  EXPECT_EQ(a.bytes_reserved(), 4096u);
  EXPECT_THROW(a.release(x), InvalidArgument);  // already released (w now starts there, with another size)
  EXPECT_THROW(a.release(kv::Blob{x.data + 256, 100}), InvalidArgument);  // never allocated
  const kv::Blob big = a.allocate(10000);        // larger than a chunk: its own chunk
  EXPECT_EQ(a.bytes_reserved(), 4096u + 10240u);
  a.release(big);
  a.release(w);
  a.release(z);
  EXPECT_EQ(a.bytes_in_use(), 0u);
}

TEST(BlobArena, CapIsReportedWithSizes) {
  kv::BlobArena a(kv::plain_host_memory(), 4096, 4096);
  a.allocate(4000);
  try {
    a.allocate(100);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arena full"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace activekv

// Plain memory from 2 MiB on: 2 MiB aligned (what lets transparent huge pages
// back it), zero-filled and writable to its last byte, and returned whole by
// free: 64 rounds of 5 MiB + 1 byte (each mapped as 6 MiB) leave the process's
// mappings (VmSize) within 16 MiB of where they started -- a free that
// unmapped only the bytes asked for would leave ~64 MiB behind.
TEST(PlainHostMemory, LargeBlocksAreHugePageAlignedZeroedAndReturned) {
  auto vm_kib = [] {
    std::ifstream f("/proc/self/status");
    std::string key;
    long kib = -1;
    while (f >> key) {
      if (key == "VmSize:") {
        f >> kib;
        break;
      }
      f.ignore(1 << 16, '\n');
    }
    return kib;
  };
  activekv::kv::HostMemory& m = activekv::kv::plain_host_memory();
  const size_t bytes = (size_t(5) << 20) + 1;
  const long vm0 = vm_kib();
  for (int round = 0; round < 64; ++round) {
    std::byte* p = m.allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t(2) << 20), 0u);
    EXPECT_EQ(p[0], std::byte{0});
    EXPECT_EQ(p[bytes - 1], std::byte{0});
    p[bytes - 1] = std::byte{7};
    p[0] = std::byte{7};
    m.free(p, bytes);
  }
  if (vm0 > 0) EXPECT_LT(vm_kib() - vm0, 16 * 1024) << "VmSize grew: frees did not return the mappings";
  // Small blocks keep their 256-byte alignment.
  std::byte* s = m.allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(s) % 256, 0u);
  m.free(s, 1000);
}
