// EngineConfig equality (no GPU; runs in CI): GpuModel::decode_batch lets
// sequences share one engine only when their configurations are equal, so
// every field must take part -- a field the comparison missed would let two
// sequences with different engines share one. A change to any field must make
// cuda::same_engine_config false (a new field fails a static_assert in
// decode_engine.cpp until it is compared; add its change here too).
#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "activekv/cuda/decode_engine.h"

namespace activekv::cuda {
namespace {

EngineConfig base() {
  EngineConfig c;
  c.n_layers = 16;
  c.attn.n_kv_heads = 4, c.attn.group = 6, c.attn.head_dim = 256;
  c.windows = {0, 512};
  return c;
}

TEST(EngineConfigHost, EveryFieldTakesPartInEquality) {
  EXPECT_TRUE(same_engine_config(base(), base()));
  const std::vector<std::function<void(EngineConfig&)>> changes = {
      [](EngineConfig& c) { c.n_layers = 15; },
      [](EngineConfig& c) { c.attn.n_kv_heads = 2; },
      [](EngineConfig& c) { c.attn.group = 8; },
      [](EngineConfig& c) { c.attn.head_dim = 128; },
      [](EngineConfig& c) { c.attn.page_size = 512; },
      [](EngineConfig& c) { c.attn.split_tokens = 256; },
      [](EngineConfig& c) { c.attn.softmax_scale = 0.5f; },
      [](EngineConfig& c) { c.attn.kv_head0 = 2; },
      [](EngineConfig& c) { c.attn.page_kv_heads = 8; },
      [](EngineConfig& c) { c.tile_pages = 16; },
      [](EngineConfig& c) { c.windows = {0, 1024}; },
      [](EngineConfig& c) { c.ring_slots = 4; },
      [](EngineConfig& c) { c.int8s.kernel = Int8sKernel::legacy; },
      [](EngineConfig& c) { c.int8s.query_terms = 1; },
      [](EngineConfig& c) { c.int8s.skip_unit_rescale = false; },
      [](EngineConfig& c) { c.int8s.pow2_reference = true; },
      [](EngineConfig& c) { c.int8s.tensor_cores = false; },
      [](EngineConfig& c) { c.int8s.tc.warps = 4; },
      [](EngineConfig& c) { c.int8s.tc.stages = 3; },
      [](EngineConfig& c) { c.int8s.tc.blocks = 2; },
      [](EngineConfig& c) { c.int8s.tc.channel_rows = true; },
      [](EngineConfig& c) { c.int8s.tc.single_v = true; },
      [](EngineConfig& c) { c.cpu_kernels.threads = 3; },
      [](EngineConfig& c) { c.cpu_kernels.split_tokens = 128; },
      [](EngineConfig& c) { c.cpu_kernels.int8s_query_terms = 1; },
      [](EngineConfig& c) { c.cpu_kernels.isa = cpu::Isa::portable; },
      [](EngineConfig& c) { c.strided_copies = true; },
      [](EngineConfig& c) { c.compute_stream = reinterpret_cast<cudaStream_t>(0x10); },
      [](EngineConfig& c) { c.overlap_formats = false; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    EngineConfig c = base();
    changes[i](c);
    EXPECT_FALSE(same_engine_config(c, base())) << "change " << i << " left the configurations equal";
  }
}

}  // namespace
}  // namespace activekv::cuda
