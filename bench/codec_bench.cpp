// Page conversion speed on the CPU (Google Benchmark): one page of the default
// model's shape (3 KV heads x 64 channels x 1024 tokens, K and V, bf16) per
// iteration. items_per_second = pages converted per second on one thread.
// Compare with the pages decode produces: n_layers pages every page_size
// tokens, i.e. 30 / 1024 pages per generated token for SmolLM2-135M.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "activekv/kv/codec.h"

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

BENCHMARK_CAPTURE(encode, int8s, kv::CodecFormat::int8s)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(encode, lossless13, kv::CodecFormat::lossless13)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, int8s, kv::CodecFormat::int8s)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(decode, lossless13, kv::CodecFormat::lossless13)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
