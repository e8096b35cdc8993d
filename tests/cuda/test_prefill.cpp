// GPU test of the chunked prefill attention (causal chunk of query rows over a
// paged history in GPU memory) against an fp64 CPU reference, plus its
// agreement with the decode engine at the chunk's last position. Labelled `gpu`.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/prefill.h"

namespace activekv::cuda {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

float bf(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct PrefillCase { AttnShape sh; int64_t pos0; int rows; };

TEST(CudaPrefill, ChunkMatchesFp64CausalReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<PrefillCase> cases = {
      {AttnShape{2, 6, 256, 64, 32, 0.f}, 240, 60},   // 27B-like head, chunk crosses pages and splits
      {AttnShape{3, 3, 64, 128, 64, 0.f}, 0, 200},    // SmolLM2-like head, first chunk of a prompt
      {AttnShape{1, 4, 256, 1024, 512, 0.f}, 1500, 37},  // Gemma-3-270M-like head
  };
  for (const PrefillCase& pc : cases) {
    const AttnShape& sh = pc.sh;
    const int64_t T = pc.pos0 + pc.rows;
    const size_t n_pages = size_t((T + sh.page_size - 1) / sh.page_size);
    PinnedPagePool host(sh.page_bytes(), n_pages);
    fill_random_bf16(host.data(), n_pages * sh.page_bytes(), 21, 2);
    std::byte* dev = nullptr;
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dev, n_pages * sh.page_bytes()));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(dev, host.data(), n_pages * sh.page_bytes(), cudaMemcpyHostToDevice));
    std::vector<const void*> pages;
    for (size_t i = 0; i < n_pages; ++i) pages.push_back(dev + i * sh.page_bytes());
    const int nq = sh.n_q_heads(), hd = sh.head_dim;
    std::vector<float> q(size_t(pc.rows) * nq * hd);
    std::mt19937_64 rng(5);
    std::normal_distribution<float> nd(0.f, 1.5f);
    for (auto& v : q) v = nd(rng);
    float *dq, *dout, *dlse;
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dq, q.size() * 4));
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dout, q.size() * 4));
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dlse, size_t(pc.rows) * nq * 4));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    ASSERT_EQ(cudaSuccess, cudaMemset(dout, 0xff, q.size() * 4));
    PrefillAttention pf(sh);
    pf.run(pages, pc.pos0, pc.rows, dq, dout, dlse, nullptr);
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    std::vector<float> out(q.size()), lse(size_t(pc.rows) * nq);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(lse.data(), dlse, lse.size() * 4, cudaMemcpyDeviceToHost));
    // Run it again: bitwise repeatable.
    pf.run(pages, pc.pos0, pc.rows, dq, dout, dlse, nullptr);
    ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
    std::vector<float> out2(q.size());
    ASSERT_EQ(cudaSuccess, cudaMemcpy(out2.data(), dout, out2.size() * 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(0, std::memcmp(out.data(), out2.data(), out.size() * 4));

    const double scale = 1.0 / std::sqrt(double(hd));
    double worst = 0, worst_lse = 0;
    for (int r = 0; r < pc.rows; ++r)
      for (int hq = 0; hq < nq; ++hq) {
        const int kvh = hq / sh.group;
        const float* qr = &q[(size_t(r) * nq + hq) * hd];
        const int64_t n = pc.pos0 + r + 1;
        std::vector<double> sc(static_cast<size_t>(n));
        std::vector<double> o(static_cast<size_t>(hd), 0.0);
        double mx = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          const uint16_t* pg = reinterpret_cast<const uint16_t*>(host.page(uint32_t(t / sh.page_size)));
          const uint16_t* k = pg + (size_t(kvh) * sh.page_size + t % sh.page_size) * hd;
          double d = 0;
          for (int i = 0; i < hd; ++i) d += double(qr[i]) * double(bf(k[i]));
          sc[size_t(t)] = d * scale;
          mx = std::max(mx, sc[size_t(t)]);
        }
        double den = 0;
        for (int64_t t = 0; t < n; ++t) {
          const double p = std::exp(sc[size_t(t)] - mx);
          den += p;
          const uint16_t* pg = reinterpret_cast<const uint16_t*>(host.page(uint32_t(t / sh.page_size)));
          const uint16_t* v = pg + (size_t(sh.n_kv_heads + kvh) * sh.page_size + t % sh.page_size) * hd;
          for (int i = 0; i < hd; ++i) o[size_t(i)] += p * double(bf(v[i]));
        }
        double om = 0, err = 0;
        for (int i = 0; i < hd; ++i) {
          const double ref = o[size_t(i)] / den;
          const float got = out[(size_t(r) * nq + hq) * hd + i];
          ASSERT_TRUE(std::isfinite(got)) << "row " << r << " head " << hq;
          om = std::max(om, std::abs(ref));
          err = std::max(err, std::abs(double(got) - ref));
        }
        worst = std::max(worst, err / std::max(om, 1e-30));
        worst_lse = std::max(worst_lse, std::abs(double(lse[size_t(r) * nq + hq]) - (mx + std::log(den))));
      }
    EXPECT_LT(worst, 2e-5) << "head_dim " << hd << " pos0 " << pc.pos0;
    EXPECT_LT(worst_lse, 2e-4) << "head_dim " << hd;

    // The chunk's last row equals a decode step over the same T tokens (same kernel and splits).
    {
      EngineConfig ec;
      ec.n_layers = 1;
      ec.attn = sh;
      ec.mode = Mode::resident;
      DecodeEngine eng(ec, host);
      SeqPages sp;
      sp.n_tokens = T;
      sp.tables.resize(1);
      for (size_t i = 0; i < n_pages; ++i) sp.tables[0].push_back(host.page_ref(uint32_t(i)));
      eng.set_batch({sp});
      float* dout1;
      ASSERT_EQ(cudaSuccess, cudaMalloc(&dout1, size_t(nq) * hd * 4));
      eng.enqueue_step(dq + size_t(pc.rows - 1) * nq * hd, dout1, nullptr);
      eng.synchronize();
      std::vector<float> dec(size_t(nq) * hd);
      ASSERT_EQ(cudaSuccess, cudaMemcpy(dec.data(), dout1, dec.size() * 4, cudaMemcpyDeviceToHost));
      EXPECT_EQ(0, std::memcmp(dec.data(), out.data() + size_t(pc.rows - 1) * nq * hd, dec.size() * 4))
          << "last prefill row vs decode, head_dim " << hd;
      cudaFree(dout1);
    }
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dev);
  }
}

TEST(CudaPrefill, RejectsBadArguments) {
  AttnShape sh{1, 2, 64, 16, 16, 0.f};
  std::vector<const void*> pages(2, nullptr);
  EXPECT_THROW(plan_prefill(sh, pages, 30, 3), InvalidArgument);  // 33 tokens > 2 pages
  EXPECT_THROW(plan_prefill(sh, pages, -1, 3), InvalidArgument);
  EXPECT_THROW(plan_prefill(sh, pages, 0, 0), InvalidArgument);
  const PrefillPlan p = plan_prefill(sh, pages, 10, 10);  // rows see 11..20 tokens
  EXPECT_EQ(p.n_splits.front(), 1);
  EXPECT_EQ(p.n_splits.back(), 2);
  EXPECT_EQ(p.max_splits, 2);
}

}  // namespace
}  // namespace activekv::cuda
