// Where published pages lie: a layer's pages converted in page order sit back
// to back in memory (each 256-byte aligned), whatever the other layers and
// formats do in between, so the decode engine streams a run of them as one
// copy. Written when the model-level bench showed hybrid 7-9 % over its floor:
// one shared arena interleaved the layers, and every 2.1 MB int8s page of the
// 27B shape became its own copy (51.9 GB/s at 2 MiB against 55.4 at 64 MiB).
#include <gtest/gtest.h>

#include <vector>

#include "activekv/convert/compressed_history.h"

namespace activekv {
namespace {

size_t aligned(size_t n) { return (n + 255) / 256 * 256; }

TEST(CompressedLayout, ALayersPagesLieBackToBack) {
  const kv::KvShape shape{3, 2, 64, 16};
  constexpr int kPages = 6;
  kv::PageStore store(shape);
  kv::SequenceKv seq(store);
  // No pool: each page converts inside schedule(), in page order, all layers
  // and both formats interleaved, as the runtime's deterministic mode does.
  convert::CompressedHistory history(seq, {kv::CodecFormat::lossless13, kv::CodecFormat::int8s}, kPages, nullptr);
  std::vector<float> k(size_t(shape.n_kv_heads) * shape.head_dim), v(k.size());
  for (int t = 0; t < kPages * shape.page_size; ++t) {
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = float((t * 7 + int(i)) % 13) - 6.f;
      v[i] = float((t * 5 + int(i)) % 11) - 5.f;
    }
    seq.reserve(1);
    for (int l = 0; l < shape.n_layers; ++l) seq.write(l, t, 1, k.data(), v.data());
    seq.commit(1);
    history.schedule();
  }
  history.wait();
  for (kv::CodecFormat f : {kv::CodecFormat::lossless13, kv::CodecFormat::int8s}) {
    for (int l = 0; l < shape.n_layers; ++l) {
      for (size_t p = 0; p + 1 < kPages; ++p) {
        const std::span<const std::byte> a = history.published(l, p, f), b = history.published(l, p + 1, f);
        ASSERT_FALSE(a.empty() || b.empty()) << "layer " << l << " page " << p;
        EXPECT_EQ(b.data(), a.data() + aligned(a.size())) << "layer " << l << " pages " << p << ", " << p + 1;
      }
    }
  }
}

}  // namespace
}  // namespace activekv
