// Page conversion and reading speed on the CPU (Google Benchmark): one page of
// the default model's shape (3 KV heads x 64 channels x 1024 tokens, K and V,
// bf16) per iteration. items_per_second = pages per second on one thread.
// Compare with the pages decode produces: n_layers pages every page_size
// tokens, i.e. 30 / 1024 pages per generated token for SmolLM2-135M.
//
// validate: the full check (header, checksum, metadata) a page gets once, when
// it is published. unpack_planes: reading a validated lossless13 page (every
// plane to fp32), what the lossless13 route does per page per step.
// attend: one decode step's attention of one layer (1 query row, 9 query
// heads, GQA 3) over 4 full pages, per format: bf16 pages through
// attend_tile, validated views through the codec kernels, and (blobs) the
// codec kernels validating each page on every call, as before views. Run with
// OMP_NUM_THREADS=1 to compare per-thread costs.
#include <benchmark/benchmark.h>

#include <random>
#include <span>
#include <string>
#include <vector>

#include "activekv/attention/attention_codecs.h"
#include "activekv/attention/paged_attention.h"
#include "activekv/kv/codec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/codec_lossless13.h"

namespace {

using activekv::bf16;
namespace kv = activekv::kv;

std::vector<bf16> random_page(const kv::KvShape& s) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<bf16> page(s.page_elements());
  for (bf16& x : page) x = activekv::f32_to_bf16(n01(rng));
  return page;
}

void encode(benchmark::State& state, kv::CodecFormat f) {
  const kv::KvShape shape{1, 3, 64, 1024};
  const std::vector<bf16> page = random_page(shape);
  for (auto _ : state) {
    kv::EncodedPage e = kv::encode_page(f, shape, page, shape.page_size);
    benchmark::DoNotOptimize(e.bytes.data());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * int64_t(shape.page_bytes()));
}

void decode(benchmark::State& state, kv::CodecFormat f) {
  const kv::KvShape shape{1, 3, 64, 1024};
  const kv::EncodedPage e = kv::encode_page(f, shape, random_page(shape), shape.page_size);
  std::vector<float> out(shape.page_elements());
  for (auto _ : state) {
    kv::decode_page_f32(e, out);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations());
}

void validate(benchmark::State& state, kv::CodecFormat f) {
  const kv::KvShape shape{1, 3, 64, 1024};
  const kv::EncodedPage e = kv::encode_page(f, shape, random_page(shape), shape.page_size);
  for (auto _ : state) benchmark::DoNotOptimize(kv::validate_page(e.bytes));
  state.SetItemsProcessed(state.iterations());
}

void unpack_planes(benchmark::State& state) {
  const kv::KvShape shape{1, 3, 64, 1024};
  const kv::EncodedPage e = kv::encode_page(kv::CodecFormat::lossless13, shape, random_page(shape), shape.page_size);
  const kv::Lossless13PageView view = kv::parse_lossless13_page(e.bytes);
  std::vector<float> out(shape.plane_elements());
  for (auto _ : state) {
    for (int p = 0; p < view.n_planes(); ++p) {
      view.decode_plane(p, out.size(), out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * int64_t(shape.page_bytes()));  // bf16 bytes produced
}

// Widening a bf16 page's planes to fp32: what the bf16 route does instead of unpack_planes.
void widen_planes(benchmark::State& state) {
  const kv::KvShape shape{1, 3, 64, 1024};
  const std::vector<bf16> page = random_page(shape);
  std::vector<float> out(shape.plane_elements());
  for (auto _ : state) {
    for (int p = 0; p < 2 * shape.n_kv_heads; ++p) {
      kv::decode_elements(kv::PageFormat::bf16, reinterpret_cast<const std::byte*>(page.data() + p * out.size()),
                          out.size(), out.data());
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * int64_t(shape.page_bytes()));
}

// One layer's history of 4 full pages, in bf16 and in both codecs.
struct AttendCase {
  static constexpr int kPages = 4, kHeads = 9;
  kv::KvShape shape{1, 3, 64, 1024};
  kv::PageStore store{shape};
  std::vector<kv::PageId> table;
  std::vector<kv::EncodedPage> int8s, lossless13;
  std::vector<float> q = std::vector<float>(size_t(kHeads) * 64);
  int64_t pos = int64_t(kPages) * 1024 - 1;
  AttendCase() {
    std::mt19937 rng(2);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (float& x : q) x = n01(rng);
    for (int p = 0; p < kPages; ++p) {
      table.push_back(store.allocate());
      auto* page = reinterpret_cast<bf16*>(store.k_plane(table.back(), 0));
      for (size_t i = 0; i < shape.page_elements(); ++i) page[i] = activekv::f32_to_bf16(n01(rng));
      int8s.push_back(kv::encode_page(kv::CodecFormat::int8s, store, table.back(), shape.page_size));
      lossless13.push_back(kv::encode_page(kv::CodecFormat::lossless13, store, table.back(), shape.page_size));
    }
  }
  activekv::attention::QueryRows rows() const { return {q.data(), 1, kHeads, &pos}; }
};

void attend(benchmark::State& state, const char* what) {
  namespace at = activekv::attention;
  const AttendCase c;
  const std::string w = what;
  std::vector<const kv::EncodedPage*> i8_blobs, l13_blobs;
  std::vector<kv::Int8sPageView> i8_views;
  std::vector<kv::Lossless13PageView> l13_views;
  for (const kv::EncodedPage& e : c.int8s) {
    i8_blobs.push_back(&e);
    i8_views.push_back(kv::parse_int8s_page(e));
  }
  for (const kv::EncodedPage& e : c.lossless13) {
    l13_blobs.push_back(&e);
    l13_views.push_back(kv::parse_lossless13_page(e.bytes));
  }
  const at::LayerHistory h{&c.store, c.table, int64_t(AttendCase::kPages) * 1024};
  const int64_t n = h.n_tokens;
  at::Workspace ws;
  const std::span<const kv::Lossless13PageView> l13(l13_views);
  const std::span<const kv::Int8sPageView> i8(i8_views);
  for (auto _ : state) {
    at::Partial out = w == "bf16"               ? at::attend_tile(h, 0, AttendCase::kPages, c.rows(), {}, ws)
                      : w == "lossless13"       ? at::attend_lossless13_tile(l13, 0, n, c.rows(), {}, ws)
                      : w == "lossless13_blobs" ? at::attend_lossless13_tile(l13_blobs, 0, n, c.rows(), {}, ws)
                      : w == "int8s"            ? at::attend_int8s_tile(i8, 0, n, c.rows(), {})
                                                : at::attend_int8s_tile(i8_blobs, 0, n, c.rows(), {});
    benchmark::DoNotOptimize(out.o.data());
  }
  state.SetItemsProcessed(state.iterations() * AttendCase::kPages);
}

BENCHMARK_CAPTURE(encode, int8s, kv::CodecFormat::int8s)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, lossless13, kv::CodecFormat::lossless13)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, int8s, kv::CodecFormat::int8s)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, lossless13, kv::CodecFormat::lossless13)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(validate, int8s, kv::CodecFormat::int8s)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(validate, lossless13, kv::CodecFormat::lossless13)->Unit(benchmark::kMillisecond);
BENCHMARK(unpack_planes)->Unit(benchmark::kMillisecond);
BENCHMARK(widen_planes)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend, bf16, "bf16")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend, lossless13, "lossless13")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend, lossless13_blobs, "lossless13_blobs")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend, int8s, "int8s")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(attend, int8s_blobs, "int8s_blobs")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
