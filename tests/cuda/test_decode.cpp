// GPU tests: paged BF16 decode attention vs an fp64 CPU reference, streamed vs
// resident bitwise equality, run-to-run repeatability, the merge's handling of
// empty partials, and argument errors. Labelled `gpu` (see CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/decode_engine.h"

namespace activekv::cuda {
namespace {

#define CK(call) ASSERT_EQ(cudaSuccess, (call)) << #call

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define NEED_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

float bf(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Case {
  AttnShape sh;
  int n_layers;
  std::vector<int64_t> lengths;
  bool shuffle_pages;
};

struct Fixture {
  Case c;
  std::unique_ptr<PinnedPagePool> pool;
  std::vector<SeqPages> seqs;
  std::vector<float> q;  // [L][S][nq][hd]

  explicit Fixture(const Case& cs, uint64_t seed) : c(cs) {
    const AttnShape& sh = c.sh;
    const int S = int(c.lengths.size());
    size_t total = 0;
    for (int64_t n : c.lengths) total += size_t((n + sh.page_size - 1) / sh.page_size) * c.n_layers;
    total += 3;  // a few unused pages
    pool = std::make_unique<PinnedPagePool>(sh.page_bytes(), total);
    fill_random_bf16(pool->data(), total * sh.page_bytes(), seed, 2);
    std::vector<uint32_t> ids(total);
    std::iota(ids.begin(), ids.end(), 0u);
    std::mt19937_64 rng(seed);
    if (c.shuffle_pages) std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    seqs.resize(S);
    for (int s = 0; s < S; ++s) {
      seqs[s].n_tokens = c.lengths[s];
      seqs[s].tables.resize(c.n_layers);
      const int64_t np = (c.lengths[s] + sh.page_size - 1) / sh.page_size;
      for (int l = 0; l < c.n_layers; ++l)
        for (int64_t p = 0; p < np; ++p) seqs[s].tables[l].push_back(pool->page_ref(ids[next++]));
    }
    q.resize(size_t(c.n_layers) * S * sh.n_q_heads() * sh.head_dim);
    std::normal_distribution<float> nd(0.f, 1.5f);
    for (auto& v : q) v = nd(rng);
  }

  // fp64 reference: O [L][S][nq][hd], LSE [L][S][nq]
  void reference(std::vector<double>& o, std::vector<double>& lse) const {
    const AttnShape& sh = c.sh;
    const int S = int(seqs.size()), nq = sh.n_q_heads(), hd = sh.head_dim;
    const double scale = 1.0 / std::sqrt(double(hd));
    o.assign(q.size(), 0.0);
    lse.assign(size_t(c.n_layers) * S * nq, -INFINITY);
    for (int l = 0; l < c.n_layers; ++l)
      for (int s = 0; s < S; ++s)
        for (int h = 0; h < nq; ++h) {
          const int kvh = h / sh.group;
          const float* qr = &q[((size_t(l) * S + s) * nq + h) * hd];
          const int64_t n = seqs[s].n_tokens;
          std::vector<double> sc(static_cast<size_t>(n));
          double mx = -INFINITY;
          for (int64_t t = 0; t < n; ++t) {
            const uint16_t* page =
                reinterpret_cast<const uint16_t*>(pool->at(seqs[s].tables[l][t / sh.page_size]));
            const uint16_t* k = page + (size_t(kvh) * sh.page_size + t % sh.page_size) * hd;
            double d = 0;
            for (int i = 0; i < hd; ++i) d += double(qr[i]) * double(bf(k[i]));
            sc[t] = d * scale;
            mx = std::max(mx, sc[t]);
          }
          double den = 0;
          double* out = &o[((size_t(l) * S + s) * nq + h) * hd];
          for (int64_t t = 0; t < n; ++t) {
            const double p = std::exp(sc[t] - mx);
            den += p;
            const uint16_t* page =
                reinterpret_cast<const uint16_t*>(pool->at(seqs[s].tables[l][t / sh.page_size]));
            const uint16_t* v = page + (size_t(sh.n_kv_heads + kvh) * sh.page_size + t % sh.page_size) * hd;
            for (int i = 0; i < hd; ++i) out[i] += p * double(bf(v[i]));
          }
          if (n > 0) {
            for (int i = 0; i < hd; ++i) out[i] /= den;
            lse[(size_t(l) * S + s) * nq + h] = mx + std::log(den);
          }
        }
  }

  // Runs `steps` decode steps with the given engine config; returns out and lse of the last.
  void run(Mode mode, int tile_pages, int ring, int steps, std::vector<float>& out, std::vector<float>& lse) {
    EngineConfig ec;
    ec.n_layers = c.n_layers;
    ec.attn = c.sh;
    ec.mode = mode;
    ec.tile_pages = tile_pages;
    ec.ring_slots = ring;
    DecodeEngine eng(ec, *pool);
    eng.set_batch(seqs);
    const size_t nl = size_t(c.n_layers) * seqs.size() * c.sh.n_q_heads();
    float *dq, *dout, *dlse;
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dq, q.size() * 4));
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dout, q.size() * 4));
    ASSERT_EQ(cudaSuccess, cudaMalloc(&dlse, nl * 4));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    for (int i = 0; i < steps; ++i) {
      ASSERT_EQ(cudaSuccess, cudaMemset(dout, 0xff, q.size() * 4));  // poison (NaN)
      ASSERT_EQ(cudaSuccess, cudaMemset(dlse, 0xff, nl * 4));
      ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
      eng.enqueue_step(dq, dout, dlse);
      eng.synchronize();
    }
    out.resize(q.size());
    lse.resize(nl);
    ASSERT_EQ(cudaSuccess, cudaMemcpy(out.data(), dout, q.size() * 4, cudaMemcpyDeviceToHost));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(lse.data(), dlse, nl * 4, cudaMemcpyDeviceToHost));
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlse);
  }
};

std::vector<Case> cases() {
  return {
      // 27B-like head (d=256, GQA 6), small pages so that tiles, tails and splits all occur
      {AttnShape{2, 6, 256, 64, 32, 0.f}, 2, {1, 300, 1000}, true},
      // SmolLM2-like head (d=64, GQA 3)
      {AttnShape{3, 3, 64, 128, 64, 0.f}, 3, {700, 129, 2048}, false},
      // Gemma-3-270M-like head (d=256, 1 KV head, 4 query heads), one long sequence
      {AttnShape{1, 4, 256, 1024, 512, 0.f}, 1, {5000}, false},
      // Llama-2/3 / Qwen2-like head (d=128, GQA 4), 256-token pages, shuffled
      {AttnShape{2, 4, 128, 256, 128, 0.f}, 2, {1, 700, 1500}, true},
  };
}

TEST(CudaDecode, ResidentMatchesFp64CpuReference) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 11);
    std::vector<double> ro, rl;
    f.reference(ro, rl);
    std::vector<float> o, l;
    f.run(Mode::resident, 0, 2, 1, o, l);
    const int hd = c.sh.head_dim;
    double worst = 0, worst_lse = 0;
    for (size_t row = 0; row < rl.size(); ++row) {
      double mx = 0, err = 0;
      for (int i = 0; i < hd; ++i) {
        ASSERT_TRUE(std::isfinite(o[row * hd + i])) << "row " << row << " not written";
        mx = std::max(mx, std::abs(ro[row * hd + i]));
        err = std::max(err, std::abs(double(o[row * hd + i]) - ro[row * hd + i]));
      }
      worst = std::max(worst, err / std::max(mx, 1e-30));
      worst_lse = std::max(worst_lse, std::abs(double(l[row]) - rl[row]));
    }
    EXPECT_LT(worst, 2e-5) << "head_dim " << hd << " group " << c.sh.group;
    EXPECT_LT(worst_lse, 2e-4) << "head_dim " << hd;
  }
}

TEST(CudaDecode, StreamedIsBitwiseEqualToResident) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 12);
    std::vector<float> ro, rl;
    f.run(Mode::resident, 0, 2, 1, ro, rl);
    struct V { int tile, ring; };
    for (V v : {V{0, 2}, V{1, 2}, V{3, 3}, V{7, 4}}) {  // 0 = whole-layer staging
      std::vector<float> so, sl;
      f.run(Mode::streamed, v.tile, v.ring, 3, so, sl);
      EXPECT_EQ(0, std::memcmp(ro.data(), so.data(), ro.size() * 4))
          << "tile_pages " << v.tile << " ring " << v.ring << " head_dim " << c.sh.head_dim;
      EXPECT_EQ(0, std::memcmp(rl.data(), sl.data(), rl.size() * 4)) << "LSE, tile_pages " << v.tile;
    }
  }
}

TEST(CudaDecode, BitwiseRepeatable) {
  NEED_GPU();
  const Case c = cases()[0];
  Fixture f(c, 13);
  std::vector<float> a, al, b, bl, s1, s1l, s2, s2l;
  f.run(Mode::resident, 0, 2, 1, a, al);
  f.run(Mode::resident, 0, 2, 4, b, bl);
  f.run(Mode::streamed, 2, 3, 2, s1, s1l);
  f.run(Mode::streamed, 2, 3, 5, s2, s2l);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  EXPECT_EQ(0, std::memcmp(s1.data(), s2.data(), a.size() * 4));
  EXPECT_EQ(0, std::memcmp(al.data(), bl.data(), al.size() * 4));
}

TEST(CudaDecode, MergeSkipsEmptyPartialsAndMatchesFormula) {
  NEED_GPU();
  AttnShape sh{1, 1, 64, 64, 64, 0.f};
  const int splits = 4, hd = 64;
  std::vector<float> o(size_t(splits) * hd), lse = {1.5f, -INFINITY, -0.25f, 3.0f};
  for (int j = 0; j < splits; ++j)
    for (int i = 0; i < hd; ++i) o[size_t(j) * hd + i] = j == 1 ? NAN : float(std::sin(j * 7 + i));
  float *dpo, *dpl, *dout, *dlse;
  int32_t* dn;
  CK(cudaMalloc(&dpo, o.size() * 4));
  CK(cudaMalloc(&dpl, 4 * 4));
  CK(cudaMalloc(&dout, hd * 4));
  CK(cudaMalloc(&dlse, 4));
  CK(cudaMalloc(&dn, 4));
  CK(cudaMemcpy(dpo, o.data(), o.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpl, lse.data(), 16, cudaMemcpyHostToDevice));
  const int32_t n = splits;
  CK(cudaMemcpy(dn, &n, 4, cudaMemcpyHostToDevice));
  launch_merge(sh, Partials{dpo, dpl, splits}, dn, 1, dout, dlse, nullptr);
  std::vector<float> out(hd);
  float ol;
  CK(cudaMemcpy(out.data(), dout, hd * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&ol, dlse, 4, cudaMemcpyDeviceToHost));
  const double M = 3.0;
  double W = 0;
  for (int j : {0, 2, 3}) W += std::exp(double(lse[j]) - M);
  for (int i = 0; i < hd; ++i) {
    double num = 0;
    for (int j : {0, 2, 3}) num += std::exp(double(lse[j]) - M) * o[size_t(j) * hd + i];
    EXPECT_NEAR(out[i], num / W, 1e-6) << i;
  }
  EXPECT_NEAR(ol, M + std::log(W), 1e-6);
  // All partials empty -> O = 0, LSE = -inf.
  std::vector<float> empty(4, -INFINITY);
  CK(cudaMemcpy(dpl, empty.data(), 16, cudaMemcpyHostToDevice));
  launch_merge(sh, Partials{dpo, dpl, splits}, dn, 1, dout, dlse, nullptr);
  CK(cudaMemcpy(out.data(), dout, hd * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&ol, dlse, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(out[0], 0.f);
  EXPECT_TRUE(std::isinf(ol) && ol < 0);
  cudaFree(dpo); cudaFree(dpl); cudaFree(dout); cudaFree(dlse); cudaFree(dn);
}

TEST(CudaDecode, RejectsBadArguments) {
  EXPECT_THROW((AttnShape{4, 6, 96, 1024, 512, 0.f}.validate()), InvalidArgument);
  EXPECT_NO_THROW((AttnShape{4, 6, 128, 1024, 512, 0.f}.validate()));
  EXPECT_THROW((AttnShape{4, 9, 256, 1024, 512, 0.f}.validate()), InvalidArgument);
  EXPECT_THROW((AttnShape{4, 6, 256, 1024, 300, 0.f}.validate()), InvalidArgument);
  NEED_GPU();
  AttnShape sh{1, 2, 64, 16, 16, 0.f};
  PinnedPagePool pool(sh.page_bytes(), 4);
  EngineConfig ec;
  ec.n_layers = 1;
  ec.attn = sh;
  DecodeEngine eng(ec, pool);
  SeqPages sp;
  sp.n_tokens = 40;  // needs 3 pages
  sp.tables = {{pool.page_ref(0), pool.page_ref(1)}};
  EXPECT_THROW(eng.set_batch({sp}), InvalidArgument);
  sp.tables = {{pool.page_ref(0), pool.page_ref(1), PageRef{9 * sh.page_bytes(), sh.page_bytes(), PageKind::bf16}}};
  EXPECT_THROW(eng.set_batch({sp}), InvalidArgument);  // page outside the pool
  sp.tables = {{pool.page_ref(0), pool.page_ref(1), PageRef{0, 100, PageKind::bf16}}};
  EXPECT_THROW(eng.set_batch({sp}), InvalidArgument);  // wrong size for a bf16 page
  sp.tables = {{pool.page_ref(0), pool.page_ref(1), PageRef{0, sh.page_bytes(), PageKind::int8s}}};
  EXPECT_THROW(eng.set_batch({sp}), InvalidArgument);  // not an int8s blob
  EXPECT_THROW(pool.page_ref(4), InvalidArgument);
  EXPECT_THROW(eng.set_batch({}), InvalidArgument);
  ec.ring_slots = 1;
  EXPECT_THROW(DecodeEngine(ec, pool), InvalidArgument);
}

}  // namespace
}  // namespace activekv::cuda
