// Head shards (issue 15) on the GPU: the engine split by KV head over N
// shards -- all on device 0 (`--gpus 0,0`: each shard its own staging,
// streams and kernels, one link), or on several GPUs when the machine has
// them -- gives bitwise the unsharded engine's O and LSE, for every route
// (bf16, int8s, hybrid, lossless13), placement (resident, streamed, mixed)
// and copy mode, GQA group 6 (the 27B shape's heads) and 8; and each shard
// moves exactly its heads' bytes. Labelled `gpu` (see CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "activekv/cuda/sharded_engine.h"
#include "route_fixture.h"

namespace activekv::cuda {
namespace {

using namespace testing_routes;

struct ShardCase {
  const char* name;
  AttnShape sh;
  std::vector<int> devices;
};

std::ostream& operator<<(std::ostream& o, const ShardCase& c) { return o << c.name; }

class Sharded : public ::testing::TestWithParam<ShardCase> {};

// A ShardedDecodeEngine driven layer by layer (begin_step + enqueue_layer, as
// the runtime does), for RouteFixture::steps.
struct PerLayer {
  ShardedDecodeEngine& e;
  int n_layers, rows;  // rows: n_seq x n_q_heads
  int head_dim;
  void synchronize() { e.synchronize(); }
  void enqueue_step(const float* q, float* out, float* lse) {
    e.begin_step();
    for (int l = 0; l < n_layers; ++l) {
      const size_t o = size_t(l) * rows;
      e.enqueue_layer(l, q + o * head_dim, out + o * head_dim, lse + o);
    }
  }
};

// The route's batch placed as `p`, as each shard reads it: resident pages on
// the shard's device (one set of copies per device, shared by its shards).
std::vector<std::vector<SeqPages>> shard_tables(const RouteFixture& f, const std::string& route, Placement p,
                                                const std::vector<int>& devices,
                                                std::vector<std::unique_ptr<ResidentPages>>& copies) {
  std::vector<std::vector<SeqPages>> out;
  std::map<int, ResidentPages*> on;
  for (int d : devices) {
    if (p != Placement::streamed && !on.count(d)) {
      EXPECT_EQ(cudaSuccess, cudaSetDevice(d));
      copies.push_back(f.device_copies());
      on[d] = copies.back().get();
    }
    EXPECT_EQ(cudaSuccess, cudaSetDevice(d));
    out.push_back(f.placed(route, p, p == Placement::streamed ? nullptr : on[d]));
  }
  EXPECT_EQ(cudaSuccess, cudaSetDevice(devices[0]));
  return out;
}

TEST_P(Sharded, BitwiseEqualToOneEngineEveryRouteAndPlacement) {
  NEED_GPU();
  const ShardCase& c = GetParam();
  for (int d : c.devices)
    if (d >= testing::gpu_count()) GTEST_SKIP() << "needs GPU " << d << " (" << testing::gpu_count() << " found)";
  RouteFixture f(c.sh, 2);
  for (const std::string route : {"bf16", "int8s", "hybrid", "lossless13"})
    for (const Placement p : {Placement::resident, Placement::streamed, Placement::mixed})
      for (const int tile : {0, 3})
        for (const bool strided : {false, true}) {
          if (p == Placement::resident && (tile != 0 || strided)) continue;  // nothing is copied
          const std::string what = route + " " + placement_name(p) + " tile " + std::to_string(tile) +
                                   (strided ? " 2D copies" : " one copy per range");
          SCOPED_TRACE(what);
          EngineConfig cfg = f.config(tile);
          cfg.strided_copies = strided;
          std::vector<std::unique_ptr<ResidentPages>> copies;  // outlive the engines
          const auto per_shard = shard_tables(f, route, p, c.devices, copies);
          DecodeEngine one(cfg);
          one.update(per_shard[0]);
          const std::vector<float> want = f.steps(one);
          ShardedDecodeEngine eng(cfg, c.devices);
          eng.update(per_shard);
          const std::vector<float> got = f.steps(eng);
          EXPECT_TRUE(same_bits(want, got)) << what << ": O and LSE of " << c.devices.size() << " shards";
          if (tile == 3 && route == "hybrid") {  // the per-layer API (a barrier per layer), same bits
            PerLayer pl{eng, f.L, int(f.lengths.size()) * c.sh.n_q_heads(), c.sh.head_dim};
            EXPECT_TRUE(same_bits(want, f.steps(pl))) << what << ": layer by layer";
          }
          EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](float v) { return !std::isnan(v); }))
              << "every output written (the poison is NaN)";
          if (p != Placement::streamed) continue;
          // Every head's bytes cross once: a bf16 page's planes split exactly over the shards.
          if (route == "bf16") EXPECT_EQ(eng.bytes_per_step(), one.bytes_per_step());
          size_t pages = 0;
          for (const auto& s : per_shard[0])
            for (const auto& t : s.tables) pages += t.size();
          if (route == "bf16" && !strided)  // two ranges (K planes, V planes) per page and shard
            EXPECT_EQ(eng.copies_per_step(), 2 * pages * c.devices.size());
          if (route == "bf16" && strided)  // the same rows, fewer calls
            EXPECT_EQ(eng.copy_rows_per_step(), 2 * pages * c.devices.size());
          if (strided) EXPECT_LT(eng.copies_per_step(), eng.copy_rows_per_step());
        }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Sharded,
    ::testing::Values(ShardCase{"group6_two_shards_on_gpu0", AttnShape{4, 6, 256, 64, 32, 0.f}, {0, 0}},
                      ShardCase{"group8_two_shards_on_gpu0", AttnShape{8, 8, 64, 64, 32, 0.f}, {0, 0}},
                      ShardCase{"group6_uneven_three_shards_on_gpu0", AttnShape{4, 6, 256, 64, 32, 0.f}, {0, 0, 0}},
                      ShardCase{"group6_four_shards_on_gpu0", AttnShape{4, 6, 256, 64, 32, 0.f}, {0, 0, 0, 0}},
                      ShardCase{"group6_gpus_0_1", AttnShape{4, 6, 256, 64, 32, 0.f}, {0, 1}},
                      ShardCase{"group8_gpus_1_0", AttnShape{8, 8, 64, 64, 32, 0.f}, {1, 0}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Sharded, ShardPlanAndBadInput) {
  EXPECT_EQ(plan_head_shards(4, {0, 1}), (std::vector<HeadShard>{{0, 0, 2}, {1, 2, 2}}));
  EXPECT_EQ(plan_head_shards(4, {0, 0, 1}), (std::vector<HeadShard>{{0, 0, 2}, {0, 2, 1}, {1, 3, 1}}));
  EXPECT_THROW(plan_head_shards(4, {}), InvalidArgument);
  EXPECT_THROW(plan_head_shards(4, {0, -1}), InvalidArgument);
  EXPECT_THROW(plan_head_shards(2, {0, 0, 0}), InvalidArgument);
  NEED_GPU();
  RouteFixture f(AttnShape{4, 6, 256, 64, 32, 0.f}, 2);
  EngineConfig cfg = f.config(3);
  EXPECT_THROW(ShardedDecodeEngine(cfg, {0, testing::gpu_count()}), InvalidArgument);  // no such GPU
  ShardedDecodeEngine eng(cfg, {0, 0});
  EXPECT_THROW(eng.begin_step(), InvalidArgument);  // no batch yet
  EXPECT_THROW(eng.update(std::vector<std::vector<SeqPages>>(3, f.tables("bf16"))), InvalidArgument);
  auto bad = f.tables("bf16");
  bad[0].tables[1][2].bytes -= 16;  // a bf16 page of the wrong size: refused, no batch left
  EXPECT_THROW(eng.update(bad), InvalidArgument);
  EXPECT_THROW(eng.begin_step(), InvalidArgument);
  EXPECT_NO_THROW(eng.update(f.tables("hybrid")));
  EXPECT_NO_THROW(eng.begin_step());
}

}  // namespace
}  // namespace activekv::cuda
