// Background conversion while the decode thread writes tokens: reserve()
// grows every layer's page table and the page store's directory while jobs
// convert the pages that became full. CI runs this under ThreadSanitizer
// (scripts/test.sh), where a job that reads the table or the directory
// instead of the page address captured at schedule() time is a reported race
// (issue 9 item 4; it was reported before the jobs captured the address).
// Outside TSan the test checks that every published page holds exactly the
// tokens written.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "activekv/convert/compressed_history.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv {
namespace {

TEST(ConversionRace, TokensWrittenWhileConversionRuns) {
  // Small pages and many layers: the tables and the store's directory grow
  // (and reallocate) many times while jobs run on two threads.
  const kv::KvShape shape{6, 2, 8, 4};
  constexpr int kTokens = 2000;
  kv::PageStore store(shape);
  kv::SequenceKv seq(store);
  convert::ConversionPool pool(2);
  const size_t max_pages = kTokens / shape.page_size;
  convert::CompressedHistory history(seq, {kv::CodecFormat::lossless13, kv::CodecFormat::int8s}, max_pages, &pool);

  std::mt19937 rng(7);
  std::normal_distribution<float> n01;
  const size_t row = size_t(shape.n_kv_heads) * shape.head_dim;
  std::vector<float> k(row), v(row), written_k;  // written_k: layer 0's K, token-major
  for (int t = 0; t < kTokens; ++t) {
    seq.reserve(1);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      for (size_t i = 0; i < row; ++i) {
        k[i] = n01(rng);
        v[i] = n01(rng);
      }
      if (layer == 0) written_k.insert(written_k.end(), k.begin(), k.end());
      seq.write(layer, t, 1, k.data(), v.data());
    }
    seq.commit(1);
    history.schedule();
  }
  history.wait();
  ASSERT_EQ(pool.failed(), 0u);
  ASSERT_EQ(history.published_count(kv::CodecFormat::lossless13), max_pages * size_t(shape.n_layers));
  ASSERT_EQ(history.published_count(kv::CodecFormat::int8s), max_pages * size_t(shape.n_layers));
  // lossless13 is exact: layer 0's published K planes give back the written
  // values rounded to bf16.
  std::vector<bf16> decoded(shape.page_elements());
  for (size_t page = 0; page < max_pages; ++page) {
    const std::span<const std::byte> blob = history.published(0, page, kv::CodecFormat::lossless13);
    ASSERT_FALSE(blob.empty());
    kv::decode_lossless13_page(kv::parse_lossless13_page(blob), decoded);
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      for (int t = 0; t < shape.page_size; ++t) {
        for (int j = 0; j < shape.head_dim; ++j) {
          const size_t tok = page * size_t(shape.page_size) + size_t(t);
          const bf16 want = f32_to_bf16(written_k[tok * row + size_t(h) * shape.head_dim + j]);
          ASSERT_EQ(decoded[size_t(h) * shape.plane_elements() + size_t(t) * shape.head_dim + j].bits, want.bits)
              << "page " << page << " head " << h;
        }
      }
    }
  }
}

}  // namespace
}  // namespace activekv
