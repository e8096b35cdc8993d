// The prefill placement arithmetic (activekv/route/prefill_plan.h): chunk
// pages, segments, bytes moved, the resident/streamed choice and the staging
// size under a budget, and the streamed chunk. The shape of the numbers is
// that of tests/cuda/test_runtime.cpp's streamed prefill (SmolLM2-135M: 30
// layers, 3 KV heads x 64, pages of 256 tokens = 196608 bytes).
#include "activekv/route/prefill_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "activekv/core/error.h"

namespace activekv::route {
namespace {

constexpr size_t kPage = 196608;  // 2 (K, V) x 3 heads x 256 tokens x 64 x 2 bytes
constexpr int kLayers = 30;

PrefillPlanInput smollm_prompt(size_t budget_pages) {
  PrefillPlanInput in;
  in.budget_bytes = budget_pages * kPage;
  in.page_bytes = kPage;
  in.page_size = 256;
  in.n_layers = kLayers;
  in.tail_bytes = kLayers * kPage;  // one decode tail page per layer
  in.pos0 = 0;
  in.n_tokens = 3000;
  in.chunk = 512;
  in.stream_chunk = 512;
  return in;
}

TEST(PrefillPlan, PagesSpannedCountsAChunkStartingAtAPageEnd) {
  EXPECT_EQ(pages_spanned(1, 64), 1);
  EXPECT_EQ(pages_spanned(64, 64), 2);   // from the last slot of one page to slot 62 of the next
  EXPECT_EQ(pages_spanned(65, 64), 2);
  EXPECT_EQ(pages_spanned(66, 64), 3);
  EXPECT_EQ(pages_spanned(96, 64), 3);
  EXPECT_EQ(pages_spanned(512, 256), 3);
  EXPECT_THROW(pages_spanned(0, 64), InvalidArgument);
}

TEST(PrefillPlan, SegmentsCoverTheHistory) {
  EXPECT_EQ(history_segments(0, 0), 0);
  EXPECT_EQ(history_segments(10, 10), 1);
  EXPECT_EQ(history_segments(10, 12), 1);
  EXPECT_EQ(history_segments(10, 3), 4);
  EXPECT_THROW(history_segments(5, 0), InvalidArgument);
}

TEST(PrefillPlan, BytesMovedAreEveryChunksEarlierFullPages) {
  // Chunks start at 0, 512, ..., 2560: 0 + 2 + 4 + 6 + 8 + 10 pages before them.
  EXPECT_EQ(streamed_prefill_bytes(0, 3000, 512, 256, 1, 1), 30u);
  EXPECT_EQ(streamed_prefill_bytes(0, 3000, 512, 256, kPage, kLayers), 30u * kPage * kLayers);
  // A prefill after 100 tokens: chunks at 100 (page 0 partly written, on the GPU) and 612.
  EXPECT_EQ(streamed_prefill_bytes(100, 1000, 512, 256, 1, 1), 2u);
  // Larger chunks re-read less: 1024-token chunks start at 0, 1024, 2048.
  EXPECT_EQ(streamed_prefill_bytes(0, 3000, 1024, 256, 1, 1), 0u + 4 + 8);
}

TEST(PrefillPlan, ResidentExactlyWhenThePromptFits) {
  // 12 pages per layer (3000 tokens) + 1 tail page per layer = 390 pages.
  const PrefillPlan r = plan_prefill(smollm_prompt(390));
  EXPECT_FALSE(r.streamed);
  EXPECT_EQ(r.chunk, 512);
  EXPECT_EQ(r.device_bytes, 360 * kPage);
  PrefillPlanInput in = smollm_prompt(390);
  in.budget_bytes -= 1;
  EXPECT_TRUE(plan_prefill(in).streamed);
}

TEST(PrefillPlan, WholeLayerStagingWhenTheBudgetHoldsTwoLayerHistories) {
  // 30 tails + 30 x 3 chunk pages + 2 x 10 staging pages (the last chunk, at
  // 2560, reads 10 pages per layer) = 140 pages.
  const PrefillPlan p = plan_prefill(smollm_prompt(140));
  EXPECT_TRUE(p.streamed);
  EXPECT_EQ(p.chunk_pages, 3);
  EXPECT_EQ(p.history_pages, 10);
  EXPECT_EQ(p.staging_pages, 10);
  EXPECT_TRUE(p.whole_layer);
  EXPECT_EQ(p.device_bytes, (90 + 20) * kPage);
  EXPECT_EQ(p.moved_bytes, 30u * kPage * kLayers);
  const PrefillPlan under = plan_prefill(smollm_prompt(139));  // one page short: 9 per buffer
  EXPECT_EQ(under.staging_pages, 9);
  EXPECT_FALSE(under.whole_layer);
}

TEST(PrefillPlan, SegmentedStagingDownToOnePagePerBufferThenOneLineWithTheSizes) {
  const PrefillPlan p = plan_prefill(smollm_prompt(124));
  EXPECT_EQ(p.staging_pages, 2);
  EXPECT_FALSE(p.whole_layer);
  EXPECT_EQ(history_segments(p.history_pages, p.staging_pages), 5);
  EXPECT_LE(p.device_bytes + 30 * kPage, 124 * kPage);
  EXPECT_EQ(plan_prefill(smollm_prompt(122)).staging_pages, 1);
  try {
    plan_prefill(smollm_prompt(121));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("22.7 MiB"), std::string::npos) << m;  // the budget: 121 pages
    EXPECT_NE(m.find("22.9 MiB"), std::string::npos) << m;  // the minimum: 122 pages
    EXPECT_NE(m.find("--gpu-kv-mem"), std::string::npos) << m;
  }
}

// A tiny model's budget of a few 8 KiB pages (the bench CLI test's partial
// row) read "0.1 MiB ... needs at least 0.1 MiB ... 0.0 MiB of decode tail
// pages": under a MiB the message counts KiB.
TEST(PrefillPlan, ASmallBudgetIsStatedInKiB) {
  PrefillPlanInput in;
  in.page_bytes = 8192;
  in.page_size = 16;
  in.n_layers = 2;
  in.tail_bytes = 2 * 8192;
  in.budget_bytes = 53687;  // --gpu-kv-mem 0.00005
  in.pos0 = 28;
  in.n_tokens = 16;
  in.chunk = 512;
  in.stream_chunk = 512;
  try {
    plan_prefill(in);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("budget of 52.4 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("16.0 KiB of decode tail pages"), std::string::npos) << m;
    EXPECT_NE(m.find("8.0 KiB a page"), std::string::npos) << m;
    EXPECT_EQ(m.find("0.0 MiB"), std::string::npos) << m;
  }
}

TEST(PrefillPlan, ALargerStreamedChunkShrinksUntilItsMinimumFits) {
  PrefillPlanInput in = smollm_prompt(200);
  in.stream_chunk = 2048;  // 9 pages per layer: 30 + 270 > 200
  const PrefillPlan p = plan_prefill(in);
  EXPECT_EQ(p.chunk, 1024);  // 5 pages per layer: 30 + 150 + 2 x 8 staging pages
  EXPECT_EQ(p.chunk_pages, 5);
  EXPECT_EQ(p.history_pages, 8);  // the last chunk starts at 2048
  EXPECT_TRUE(p.whole_layer);
  EXPECT_EQ(p.moved_bytes, size_t(4 + 8) * kPage * kLayers);
}

TEST(PrefillPlan, StreamChunkDoublesWithinTheCapThePromptAndTheWorkspace) {
  EXPECT_EQ(choose_stream_chunk(512, 100000, 1, size_t(1) << 40), kMaxStreamChunk);
  EXPECT_EQ(choose_stream_chunk(512, 700, 1, size_t(1) << 40), 1024);  // one chunk covers the prompt
  EXPECT_EQ(choose_stream_chunk(512, 300, 1, size_t(1) << 40), 512);
  EXPECT_EQ(choose_stream_chunk(512, 100000, 1000, 512 * 1000), 1024);  // 2048 would add 1536 rows
  EXPECT_EQ(choose_stream_chunk(512, 100000, 1000, 0), 512);
  EXPECT_EQ(choose_stream_chunk(4096, 100000, 1, size_t(1) << 40), 4096);
  EXPECT_THROW(choose_stream_chunk(0, 10, 1, 1), InvalidArgument);
}

TEST(PrefillPlan, BadInputIsRefused) {
  PrefillPlanInput in = smollm_prompt(1000);
  in.n_tokens = 0;
  EXPECT_THROW(plan_prefill(in), InvalidArgument);
}

}  // namespace
}  // namespace activekv::route
