// GPU tests: paged BF16 decode attention vs an fp64 CPU reference; resident,
// streamed and mixed placements bitwise equal; incremental updates bitwise
// equal to a fresh engine; run-to-run repeatability; the merge's handling of
// empty partials; argument errors. Labelled `gpu` (see CMakeLists.txt).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "activekv/cuda/decode_attention.h"
#include "activekv/cuda/decode_engine.h"
#include "activekv/cuda/device_pages.h"
#include "activekv/cuda/pinned_memory.h"
#include "activekv/cuda/quant_matvec.h"
#include "activekv/kv/codec_int8s.h"
#include "activekv/kv/page_store.h"
#include "device_array.h"
#include "gpu_test_util.h"

namespace activekv::cuda {
namespace {

struct Case {
  AttnShape sh;
  int n_layers;
  std::vector<int64_t> lengths;
  bool shuffle_pages;
};

/// Where the pages of a batch lie for a run.
enum class Placement {
  resident,       ///< every page read in place from a device copy
  streamed,       ///< every page streamed from pinned host memory
  mixed,          ///< a checkerboard over (sequence, layer, page): jobs, tiles and copy runs all mix
  tail_resident,  ///< streamed but each table's last page (the runtime's page being written)
  cpu_mixed,      ///< co-attention: a third of the pages on the host CPU, a third resident, a third streamed
  cpu_all,        ///< co-attention: every page on the host CPU (the GPU only merges)
};

const char* placement_name(Placement p) {
  switch (p) {
    case Placement::resident: return "resident";
    case Placement::streamed: return "streamed";
    case Placement::mixed: return "mixed";
    case Placement::tail_resident: return "tail-resident";
    case Placement::cpu_mixed: return "cpu-mixed";
    case Placement::cpu_all: return "cpu-all";
  }
  return "?";
}

bool attended_by_cpu(Placement p, size_t seq, size_t layer, size_t page) {
  if (p == Placement::cpu_all) return true;
  return p == Placement::cpu_mixed && (seq + layer + page) % 3 == 0;
}

bool keeps_device_copy(Placement p, size_t seq, size_t layer, size_t page, size_t n_pages) {
  switch (p) {
    case Placement::resident: return true;
    case Placement::streamed: return false;
    case Placement::mixed: return (seq + layer + page) % 2 == 0;
    case Placement::tail_resident: return page + 1 == n_pages;
    case Placement::cpu_mixed: return (seq + layer + page) % 3 == 1;
    case Placement::cpu_all: return false;
  }
  return false;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Device q, out and lse of one batch (q uploaded once). step() poisons out
// and lse (NaN: an element a step does not write shows), runs one decode step
// on `eng` and downloads them. Throws CudaError.
class DeviceBatch {
 public:
  DeviceBatch(const std::vector<float>& q, size_t n_rows) : nq_(q.size()), nl_(n_rows) {
    check_cuda(cudaMalloc(&q_, nq_ * 4), "cudaMalloc q");
    check_cuda(cudaMalloc(&out_, nq_ * 4), "cudaMalloc out");
    check_cuda(cudaMalloc(&lse_, nl_ * 4), "cudaMalloc lse");
    check_cuda(cudaMemcpy(q_, q.data(), nq_ * 4, cudaMemcpyHostToDevice), "upload q");
  }
  ~DeviceBatch() {
    cudaFree(q_);
    cudaFree(out_);
    cudaFree(lse_);
  }
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  void step(DecodeEngine& eng, std::vector<float>& out, std::vector<float>& lse) {
    eng.synchronize();
    check_cuda(cudaMemset(out_, 0xff, nq_ * 4), "poison out");
    check_cuda(cudaMemset(lse_, 0xff, nl_ * 4), "poison lse");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the poison");  // the engine's streams do not wait for it
    eng.enqueue_step(q_, out_, lse_);
    eng.synchronize();
    out.resize(nq_);
    lse.resize(nl_);
    check_cuda(cudaMemcpy(out.data(), out_, nq_ * 4, cudaMemcpyDeviceToHost), "download out");
    check_cuda(cudaMemcpy(lse.data(), lse_, nl_ * 4, cudaMemcpyDeviceToHost), "download lse");
  }

 private:
  size_t nq_, nl_;
  float *q_ = nullptr, *out_ = nullptr, *lse_ = nullptr;
};

// What a run's engine reported for its batch.
struct RunStats {
  size_t streamed_bytes = 0;  // bytes_per_step()
  size_t resident_bytes = 0;  // resident_bytes_per_step()
  size_t cpu_bytes = 0;       // cpu_bytes_per_step()
};

struct Fixture {
  Case c;
  std::unique_ptr<kv::PageStore> store;  // pinned: the pages the engine streams
  std::vector<SeqPages> seqs;            // the batch at the case's lengths, every page streamed
  std::vector<float> q;                  // [L][S][nq][hd]

  explicit Fixture(const Case& cs, uint64_t seed) : c(cs) {
    const AttnShape& sh = c.sh;
    const int S = int(c.lengths.size());
    size_t total = 0;
    for (int64_t n : c.lengths) total += size_t((n + sh.page_size - 1) / sh.page_size) * c.n_layers;
    total += 3;  // a few unused pages
    const kv::KvShape ks{1, sh.n_kv_heads, sh.head_dim, sh.page_size};
    store = std::make_unique<kv::PageStore>(ks, total, &pinned_host_memory());
    std::vector<kv::PageId> ids(total);
    for (kv::PageId& id : ids) {
      id = store->allocate();
      activekv::testing::fill_random_bf16(store->page_data(id), sh.page_bytes(), seed * 1000003 + id);
    }
    std::mt19937_64 rng(seed);
    if (c.shuffle_pages) std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    seqs.resize(size_t(S));
    for (int s = 0; s < S; ++s) {
      seqs[s].n_tokens = c.lengths[s];
      seqs[s].tables.resize(size_t(c.n_layers));
      const int64_t np = (c.lengths[s] + sh.page_size - 1) / sh.page_size;
      for (int l = 0; l < c.n_layers; ++l)
        for (int64_t p = 0; p < np; ++p)
          seqs[s].tables[l].push_back(PageRef{store->page_data(ids[next++]), nullptr, sh.page_bytes(), PageKind::bf16});
    }
    q.resize(size_t(c.n_layers) * S * sh.n_q_heads() * sh.head_dim);
    std::normal_distribution<float> nd(0.f, 1.5f);
    for (auto& v : q) v = nd(rng);
  }

  size_t n_rows() const { return size_t(c.n_layers) * seqs.size() * size_t(c.sh.n_q_heads()); }

  EngineConfig config(int tile_pages, int ring, const std::vector<int>& windows = {}) const {
    EngineConfig ec;
    ec.n_layers = c.n_layers;
    ec.attn = c.sh;
    ec.tile_pages = tile_pages;
    ec.ring_slots = ring;
    ec.windows = windows;
    return ec;
  }

  // The batch with sequence s at n[s] tokens (within its case length's
  // pages): each table cut to the pages n[s] needs.
  std::vector<SeqPages> at(const std::vector<int64_t>& n) const {
    std::vector<SeqPages> out = seqs;
    for (size_t s = 0; s < out.size(); ++s) {
      out[s].n_tokens = n.at(s);
      for (auto& t : out[s].tables) t.resize(size_t((n[s] + c.sh.page_size - 1) / c.sh.page_size));
    }
    return out;
  }

  // Device copies for every page of the store (placements other than streamed).
  std::unique_ptr<ResidentPages> device_copies() const {
    return std::make_unique<ResidentPages>(c.sh.page_bytes(), store->pages_in_use());
  }

  // `tables` with the pages `p` keeps on the GPU given their copies in `rp`.
  static std::vector<SeqPages> place(const std::vector<SeqPages>& tables, Placement p, ResidentPages* rp) {
    if (p == Placement::streamed) return tables;
    std::vector<SeqPages> out = rp ? rp->place(tables) : tables;
    for (size_t s = 0; s < out.size(); ++s)
      for (size_t l = 0; l < out[s].tables.size(); ++l) {
        auto& t = out[s].tables[l];
        for (size_t pg = 0; pg < t.size(); ++pg) {
          if (!keeps_device_copy(p, s, l, pg, t.size())) t[pg].device = nullptr;
          t[pg].cpu = attended_by_cpu(p, s, l, pg);
        }
      }
    return out;
  }

  // fp64 reference (attention::reference_attention over the pages) of the
  // batch `tables`: O [L][S][nq][hd], LSE [L][S][nq].
  void reference(const std::vector<SeqPages>& tables, std::vector<double>& o, std::vector<double>& lse,
                 const std::vector<int>& windows = {}) const {
    const AttnShape& sh = c.sh;
    const int S = int(tables.size()), nq = sh.n_q_heads(), hd = sh.head_dim;
    const kv::KvShape ks{1, sh.n_kv_heads, hd, sh.page_size};
    o.clear();
    lse.clear();
    for (int l = 0; l < c.n_layers; ++l)
      for (int s = 0; s < S; ++s) {
        std::vector<const std::byte*> pages;
        for (const PageRef& r : tables[s].tables[l]) pages.push_back(r.host);
        const attention::DenseHistoryF64 h = activekv::testing::dense_history(ks, pages, tables[s].n_tokens);
        const int64_t pos = tables[s].n_tokens - 1;
        attention::AttentionOptions opt;
        opt.window = windows.empty() ? 0 : windows[size_t(l)];
        const attention::ReferencePartial ref =
            attention::reference_attention(h, {&q[(size_t(l) * S + s) * nq * hd], 1, nq, &pos}, opt);
        o.insert(o.end(), ref.o.begin(), ref.o.end());
        lse.insert(lse.end(), ref.lse.begin(), ref.lse.end());
      }
  }

  // Runs `steps` decode steps of the case's batch placed as `p` on a new
  // engine; returns out and lse of the last. Throws on a CUDA error.
  RunStats run(Placement p, int tile_pages, int ring, int steps, std::vector<float>& out, std::vector<float>& lse,
               const std::vector<int>& windows = {}, const std::vector<SeqPages>* tables = nullptr) const {
    std::unique_ptr<ResidentPages> rp;  // outlives the engine (destroyed after it)
    if (p != Placement::streamed && p != Placement::cpu_all) rp = device_copies();
    DecodeEngine eng(config(tile_pages, ring, windows));
    eng.update(place(tables ? *tables : seqs, p, rp.get()));
    DeviceBatch dev(q, n_rows());
    for (int i = 0; i < steps; ++i) dev.step(eng, out, lse);
    return RunStats{eng.bytes_per_step(), eng.resident_bytes_per_step(), eng.cpu_bytes_per_step()};
  }

  // Bytes of every page the batch reads (each bf16 page once per layer).
  size_t history_bytes() const {
    size_t b = 0;
    for (const SeqPages& s : seqs)
      for (const auto& t : s.tables) b += t.size() * c.sh.page_bytes();
    return b;
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
      // Llama-3-8B-like head (d=128, GQA 8): every row of the Q.K^T mma's hi
      // half holds a head (the packed form puts mid in rows 8..15)
      {AttnShape{1, 8, 128, 128, 64, 0.f}, 1, {700}, false},
  };
}

// Largest relative error on O rows (by the row's max |O|) and absolute error on LSE vs fp64.
struct Fp64Errors { double o = 0, lse = 0; };

Fp64Errors errors_vs_fp64(const std::vector<float>& o, const std::vector<float>& l, const std::vector<double>& ro,
                          const std::vector<double>& rl, int hd) {
  Fp64Errors e;
  for (size_t row = 0; row < rl.size(); ++row) {
    double mx = 0, err = 0;
    for (int i = 0; i < hd; ++i) {
      if (!std::isfinite(o[row * hd + i])) return Fp64Errors{INFINITY, INFINITY};  // not written
      mx = std::max(mx, std::abs(ro[row * hd + i]));
      err = std::max(err, std::abs(double(o[row * hd + i]) - ro[row * hd + i]));
    }
    e.o = std::max(e.o, err / std::max(mx, 1e-30));
    e.lse = std::max(e.lse, std::abs(double(l[row]) - rl[row]));
  }
  return e;
}

// fp32 kernel (3-term bf16 query on the tensor cores) against fp64. Measured on the H200 at
// d68a9cb (bench/results/h200_device_tests_run.log, all three cases): at most 1.21e-6 relative
// on O, 7.97e-7 on LSE. Bounds: ~3x that (the old 2e-5 / 2e-4 were 17x / 250x).
constexpr double kMaxRelOErr = 3.7e-6, kMaxLseErr = 2.4e-6;

TEST(CudaDecode, ResidentMatchesFp64CpuReference) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 11);
    std::vector<double> ro, rl;
    f.reference(f.seqs, ro, rl);
    std::vector<float> o, l;
    f.run(Placement::resident, 0, 2, 1, o, l);
    const Fp64Errors e = errors_vs_fp64(o, l, ro, rl, c.sh.head_dim);
    std::printf("  head_dim %d group %d page %d: max rel O err %.3e, max |LSE err| %.3e vs fp64\n", c.sh.head_dim,
                c.sh.group, c.sh.page_size, e.o, e.lse);
    EXPECT_LT(e.o, kMaxRelOErr) << "head_dim " << c.sh.head_dim << " group " << c.sh.group << " (inf: not written)";
    EXPECT_LT(e.lse, kMaxLseErr) << "head_dim " << c.sh.head_dim;
  }
}

TEST(CudaDecode, StreamedIsBitwiseEqualToResident) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 12);
    std::vector<float> ro, rl;
    const RunStats rs = f.run(Placement::resident, 0, 2, 1, ro, rl);
    EXPECT_EQ(rs.streamed_bytes, 0u) << "a resident batch copies nothing";
    EXPECT_EQ(rs.resident_bytes, f.history_bytes());
    struct V { int tile, ring; };
    for (V v : {V{0, 2}, V{1, 2}, V{3, 3}, V{7, 4}}) {  // 0 = a layer's pages in one job
      std::vector<float> so, sl;
      const RunStats ss = f.run(Placement::streamed, v.tile, v.ring, 3, so, sl);
      EXPECT_TRUE(same_bits(ro, so)) << "tile_pages " << v.tile << " ring " << v.ring << " head_dim " << c.sh.head_dim;
      EXPECT_TRUE(same_bits(rl, sl)) << "LSE, tile_pages " << v.tile;
      // Page sizes here are multiples of 256 bytes: copy runs move exactly the pages' bytes.
      EXPECT_EQ(ss.streamed_bytes, f.history_bytes()) << "tile_pages " << v.tile;
      EXPECT_EQ(ss.resident_bytes, 0u);
    }
  }
}

// Sliding windows (EngineConfig::windows, Gemma 3's local layers): the even
// layers of each case slide with a window that starts mid-page and mid-split
// (page + split/2 + 3 tokens), the odd ones attend everything. Against the
// fp64 reference with the same windows, at the bounds above (the same
// kernel over fewer splits); streamed and resident bitwise equal; and the
// entries before a windowed layer's first visible page may be empty (no
// bytes anywhere: the engine neither checks nor reads them).
TEST(CudaDecode, SlidingWindowLayersMatchFp64AndReadOnlyTheirWindow) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 17);
    const int window = c.sh.page_size + c.sh.split_tokens / 2 + 3;
    std::vector<int> windows(size_t(c.n_layers));
    for (int l = 0; l < c.n_layers; l += 2) windows[size_t(l)] = window;
    std::vector<double> ro, rl;
    f.reference(f.seqs, ro, rl, windows);
    std::vector<float> o, l;
    f.run(Placement::resident, 0, 2, 1, o, l, windows);
    const Fp64Errors e = errors_vs_fp64(o, l, ro, rl, c.sh.head_dim);
    std::printf("  window %d, head_dim %d page %d: max rel O err %.3e, max |LSE err| %.3e vs fp64\n", window,
                c.sh.head_dim, c.sh.page_size, e.o, e.lse);
    EXPECT_LT(e.o, kMaxRelOErr) << "head_dim " << c.sh.head_dim << " (inf: not written)";
    EXPECT_LT(e.lse, kMaxLseErr) << "head_dim " << c.sh.head_dim;
    std::vector<SeqPages> blank = f.seqs;  // windowed layers: no page before the window
    for (SeqPages& sp : blank)
      for (int ly = 0; ly < c.n_layers; ly += 2) {
        const int64_t first = std::max<int64_t>(0, sp.n_tokens - window) / c.sh.page_size;
        for (int64_t p = 0; p < first; ++p) sp.tables[size_t(ly)][size_t(p)] = PageRef{};
      }
    for (int tile : {0, 1, 3}) {
      std::vector<float> so, sl;
      f.run(Placement::streamed, tile, 3, 2, so, sl, windows, &blank);
      EXPECT_TRUE(same_bits(o, so) && same_bits(l, sl)) << "streamed (tile_pages " << tile
                                                        << ") differs from resident, head_dim " << c.sh.head_dim;
    }
  }
}

// Issue 9: the engine places page by page. Some pages read in place on the
// GPU, the others streamed -- jobs, tiles and copy runs mixed -- give the bits
// of the all-resident and the all-streamed runs.
TEST(CudaDecode, MixedPlacementIsBitwiseEqualToResidentAndStreamed) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 16);
    std::vector<float> ro, rl, so, sl;
    f.run(Placement::resident, 0, 2, 1, ro, rl);
    f.run(Placement::streamed, 3, 3, 1, so, sl);
    ASSERT_TRUE(same_bits(ro, so) && same_bits(rl, sl)) << "streamed != resident (see StreamedIsBitwiseEqualToResident)";
    struct V { int tile, ring; };
    for (Placement p : {Placement::mixed, Placement::tail_resident})
      for (V v : {V{0, 2}, V{1, 2}, V{3, 3}}) {
        std::vector<float> mo, ml;
        const RunStats ms = f.run(p, v.tile, v.ring, 2, mo, ml);
        const std::string what = std::string(placement_name(p)) + ", tile_pages " + std::to_string(v.tile) +
                                 " ring " + std::to_string(v.ring) + " head_dim " + std::to_string(c.sh.head_dim);
        EXPECT_TRUE(same_bits(ro, mo)) << what << ": O differs from the resident and streamed runs";
        EXPECT_TRUE(same_bits(rl, ml)) << what << ": LSE differs";
        EXPECT_GT(ms.streamed_bytes, 0u) << what << ": some pages must be streamed";
        EXPECT_GT(ms.resident_bytes, 0u) << what << ": some pages must be resident";
        EXPECT_EQ(ms.streamed_bytes + ms.resident_bytes, f.history_bytes()) << what << ": every page read once";
      }
  }
}

// Issue 12: co-attention. Pages the table marks `cpu` are attended by the
// host CPU in place; their split partials join the GPU's in the one merge.
// The result is attention over the same keys by another fp32 kernel: it is
// bounded against fp64, bitwise repeatable, and every page is read exactly
// once (streamed, resident or by the CPU).
// The CPU's bf16 kernel rounds differently (the query in two bf16 terms, its
// own fp32 order), so the merged result has its own bounds. Measured on the
// H200 host at bc0e99a (AVX-512 kernels, all four cases): at most 4.43e-6
// relative on O (d 64, every page on the CPU), 3.49e-6 on LSE (d 128).
// Bounds: ~3x that.
constexpr double kCoAttnMaxRelOErr = 1.3e-5, kCoAttnMaxLseErr = 1.05e-5;

TEST(CudaDecode, CoAttentionWithTheHostCpuMatchesFp64AndRepeats) {
  NEED_GPU();
  for (const Case& c : cases()) {
    Fixture f(c, 21);
    std::vector<double> ro, rl;
    f.reference(f.seqs, ro, rl);
    for (Placement p : {Placement::cpu_mixed, Placement::cpu_all}) {
      const std::string what = std::string(placement_name(p)) + " head_dim " + std::to_string(c.sh.head_dim) +
                               " group " + std::to_string(c.sh.group);
      std::vector<float> o, l, o2, l2;
      const RunStats st = f.run(p, 2, 3, 2, o, l);
      f.run(p, 2, 3, 1, o2, l2);
      const Fp64Errors e = errors_vs_fp64(o, l, ro, rl, c.sh.head_dim);
      std::printf("  %s: max rel O err %.3e, max |LSE err| %.3e vs fp64; CPU read %zu B, streamed %zu B, "
                  "resident %zu B\n", what.c_str(), e.o, e.lse, st.cpu_bytes, st.streamed_bytes, st.resident_bytes);
      EXPECT_LT(e.o, kCoAttnMaxRelOErr) << what << " (inf: not written)";
      EXPECT_LT(e.lse, kCoAttnMaxLseErr) << what;
      EXPECT_TRUE(same_bits(o, o2) && same_bits(l, l2)) << what << ": not repeatable (second engine, first step)";
      EXPECT_GT(st.cpu_bytes, 0u) << what;
      if (p == Placement::cpu_all) EXPECT_EQ(st.streamed_bytes + st.resident_bytes, 0u) << what;
      else EXPECT_LT(st.streamed_bytes + st.resident_bytes, f.history_bytes()) << what;
    }
  }
}

// A page for the CPU must be one it can read: no device copy, not
// lossless13, an int8s page only with its parsed view.
TEST(CudaDecode, CoAttentionRejectsPagesTheCpuCannotRead) {
  NEED_GPU();
  Fixture f(cases()[0], 22);
  DecodeEngine eng(f.config(2, 2));
  auto expect_rejected = [&](auto edit, const char* needle) {
    std::vector<SeqPages> t = f.seqs;
    edit(t[1].tables[0][0]);
    try {
      eng.update(t);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  alignas(16) static const std::byte dummy[16] = {};
  expect_rejected([](PageRef& r) { r.cpu = true; r.device = dummy; }, "device copy");
  expect_rejected([](PageRef& r) { r.cpu = true; r.kind = PageKind::int8s; }, "int8s_view");
  std::vector<SeqPages> ok = f.seqs;
  ok[1].tables[0][0].cpu = true;
  EXPECT_NO_THROW(eng.update(ok));
}

// A CPU task that fails (here: a page view that claims fewer tokens than the
// step reads, as a stale view would) makes its step's partials NaN. The
// engine reports it through check_cpu_error() once the step's output was
// waited for -- where the runtime checks, before it commits the step -- and
// once only. Found by reading (session 23): the runtime committed the NaN
// step and reported the error a step late.
TEST(CudaDecode, CoAttentionTaskErrorIsReportedAtItsStep) {
  NEED_GPU();
  const Case c = cases()[0];  // a copy: cases() returns a temporary. Pages of 64 tokens: int8s takes multiples of 16
  Fixture f(c, 23);
  const kv::KvShape ks{1, c.sh.n_kv_heads, c.sh.head_dim, c.sh.page_size};
  std::vector<SeqPages> t = f.seqs;
  PageRef& r = t[2].tables[0][0];  // sequence 2 (1000 tokens): a full page
  const kv::EncodedPage blob = kv::encode_int8s_page(
      ks, std::span<const bf16>(reinterpret_cast<const bf16*>(r.host), ks.page_elements()), c.sh.page_size);
  kv::Int8sPageView stale = kv::parse_int8s_page(blob);
  stale.header.n_tokens = 0;  // the engine checks the blob; the CPU kernel trusts the view's count
  r = PageRef{blob.bytes.data(), nullptr, blob.bytes.size(), PageKind::int8s};
  r.cpu = true;
  r.int8s_view = &stale;
  DecodeEngine eng(f.config(2, 2));
  eng.update(t);
  float *q = nullptr, *out = nullptr;
  const size_t nq = f.q.size();
  check_cuda(cudaMalloc(&q, nq * 4), "cudaMalloc q");
  check_cuda(cudaMalloc(&out, nq * 4), "cudaMalloc out");
  check_cuda(cudaMemcpy(q, f.q.data(), nq * 4, cudaMemcpyHostToDevice), "upload q");
  eng.enqueue_step(q, out, nullptr);
  check_cuda(cudaStreamSynchronize(eng.compute_stream()), "wait for the step's output");  // as a token's wait
  EXPECT_THROW(eng.check_cpu_error(), Error) << "the failed task's error, at the step it failed";
  EXPECT_NO_THROW(eng.check_cpu_error()) << "reported once";
  std::vector<float> o(nq);
  check_cuda(cudaMemcpy(o.data(), out, nq * 4, cudaMemcpyDeviceToHost), "download out");
  EXPECT_TRUE(std::any_of(o.begin(), o.end(), [](float x) { return std::isnan(x); })) << "the step's output is poisoned";
  EXPECT_NO_THROW(eng.synchronize()) << "the error was taken by check_cpu_error";
  cudaFree(q);
  cudaFree(out);
}

// Issue 9: update() is incremental. One engine follows a batch as it grows --
// one token, across a split and a page boundary, pages moving between host and
// GPU, nothing changed -- and after every update gives the bits of a fresh
// engine given the same tables; a one-token growth rewrites only the work
// entries of the tails' splits.
TEST(CudaDecode, IncrementalUpdatesMatchAFreshEngine) {
  NEED_GPU();
  // d=128, GQA 4, 128-token pages of 4 splits; the lengths give each sequence pages to grow into.
  const Case c{AttnShape{2, 4, 128, 128, 32, 0.f}, 2, {1100, 700, 260}, true};
  Fixture f(c, 15);
  const size_t S = c.lengths.size(), L = size_t(c.n_layers);
  enum class Patches { any, one_token, none };
  struct State { std::vector<int64_t> n; Placement place; Patches patches; const char* what; };
  const std::vector<State> states = {
      {{1000, 650, 200}, Placement::streamed, Patches::any, "the first batch"},
      {{1001, 651, 201}, Placement::streamed, Patches::one_token, "every sequence one token longer"},
      {{1001, 651, 201}, Placement::streamed, Patches::none, "the same batch again"},
      {{1030, 651, 201}, Placement::streamed, Patches::any, "sequence 0 across a split and onto a new page"},
      {{1030, 700, 256}, Placement::streamed, Patches::any, "sequences 1 and 2 grow, 2 fills its tail page"},
      {{1030, 700, 257}, Placement::streamed, Patches::any, "sequence 2 starts a new page"},
      {{1030, 700, 257}, Placement::mixed, Patches::any, "half the pages move to the GPU"},
      {{1031, 701, 258}, Placement::mixed, Patches::one_token, "one token longer, mixed"},
      {{1031, 701, 258}, Placement::tail_resident, Patches::any, "only the tail pages on the GPU"},
      {{1100, 700, 260}, Placement::streamed, Patches::any, "all on the host, sequence 1 shorter again"},
  };
  std::unique_ptr<ResidentPages> rp = f.device_copies();
  DeviceBatch dev(f.q, f.n_rows());
  struct V { int tile, ring; };
  for (V v : {V{3, 3}, V{0, 2}, V{1, 2}}) {
    DecodeEngine eng(f.config(v.tile, v.ring));
    std::vector<float> o, l;
    for (const State& st : states) {
      const std::string what =
          std::string(st.what) + " (tile_pages " + std::to_string(v.tile) + " ring " + std::to_string(v.ring) + ")";
      const std::vector<SeqPages> tables = Fixture::place(f.at(st.n), st.place, rp.get());
      eng.update(tables);
      const size_t patches = eng.last_patch_entries();
      size_t work = 0;
      for (int layer = 0; layer < c.n_layers; ++layer)
        for (const auto& j : eng.job_info(layer)) work += size_t(j.n_work);
      dev.step(eng, o, l);
      dev.step(eng, o, l);  // the second step reuses the ring
      DecodeEngine fresh(f.config(v.tile, v.ring));
      fresh.update(tables);
      std::vector<float> fo, fl;
      dev.step(fresh, fo, fl);
      EXPECT_TRUE(same_bits(o, fo)) << what << ": O differs from a fresh engine's";
      EXPECT_TRUE(same_bits(l, fl)) << what << ": LSE differs from a fresh engine's";
      if (st.patches == Patches::none) EXPECT_EQ(patches, 0u) << what << ": nothing changed";
      if (st.patches == Patches::one_token) {
        // Each (sequence, layer) changes one entry: its tail split's token count. Asserted: at most
        // twice that, and a small part of the lists (here S*L = 6 of ~120 entries).
        EXPECT_GT(patches, 0u) << what;
        EXPECT_LE(patches, 2 * S * L) << what << " (" << work << " work entries)";
        EXPECT_LT(patches * 10, work) << what;
      }
    }
    // The last state against fp64, so that "equal to a fresh engine" is also right.
    std::vector<double> ro, rl;
    f.reference(f.at(states.back().n), ro, rl);
    const Fp64Errors e = errors_vs_fp64(o, l, ro, rl, c.sh.head_dim);
    EXPECT_LT(e.o, kMaxRelOErr) << "tile_pages " << v.tile << " (inf: not written)";
    EXPECT_LT(e.lse, kMaxLseErr) << "tile_pages " << v.tile;
  }
}

TEST(CudaDecode, BitwiseRepeatable) {
  NEED_GPU();
  const Case c = cases()[0];
  Fixture f(c, 13);
  std::vector<float> a, al, b, bl, s1, s1l, s2, s2l;
  f.run(Placement::resident, 0, 2, 1, a, al);
  f.run(Placement::resident, 0, 2, 4, b, bl);
  f.run(Placement::streamed, 2, 3, 2, s1, s1l);
  f.run(Placement::streamed, 2, 3, 5, s2, s2l);
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_TRUE(same_bits(s1, s2));
  EXPECT_TRUE(same_bits(al, bl));
}

// Kernel attributes (the dynamic shared memory limit) are set per device
// (src/cuda/once_per_device.h): every GPU, and host threads launching at the
// same time, must run the kernels and get the resident run's bits. With one
// GPU only the threads are exercised; with two, a flag per process (the old
// code) makes the second GPU's launches fail.
TEST(CudaDecode, EveryDeviceAndThreadGetsTheSameBits) {
  NEED_GPU();
  const int n_dev = activekv::testing::gpu_count();
  const Case c = cases()[0];  // head_dim 256: its kernel needs more than the 48 KiB default
  Fixture f(c, 14);
  std::vector<float> ref, ref_lse;
  CUDA_OK(cudaSetDevice(0));
  f.run(Placement::resident, 0, 2, 1, ref, ref_lse);
  constexpr int kThreads = 4;
  std::vector<std::vector<float>> outs(kThreads), lses(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        check_cuda(cudaSetDevice((t + 1) % n_dev), "cudaSetDevice");  // GPU 1 first where there is one
        f.run(t % 2 ? Placement::resident : Placement::streamed, 2, 3, 2, outs[size_t(t)], lses[size_t(t)]);
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  CUDA_OK(cudaSetDevice(0));
  for (int t = 0; t < kThreads; ++t) {
    const int dev = (t + 1) % n_dev;
    EXPECT_EQ(errors[size_t(t)], "") << "thread " << t << " on GPU " << dev;
    EXPECT_TRUE(same_bits(outs[size_t(t)], ref))
        << "thread " << t << " on GPU " << dev << ": output differs from GPU 0's resident run";
  }
  if (n_dev < 2) std::printf("  one GPU: threads checked, a second GPU's configuration is not exercised\n");
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
  CUDA_OK(cudaMalloc(&dpo, o.size() * 4));
  CUDA_OK(cudaMalloc(&dpl, 4 * 4));
  CUDA_OK(cudaMalloc(&dout, hd * 4));
  CUDA_OK(cudaMalloc(&dlse, 4));
  CUDA_OK(cudaMalloc(&dn, 4));
  CUDA_OK(cudaMemcpy(dpo, o.data(), o.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dpl, lse.data(), 16, cudaMemcpyHostToDevice));
  const int32_t n = splits;
  CUDA_OK(cudaMemcpy(dn, &n, 4, cudaMemcpyHostToDevice));
  launch_merge(sh, Partials{dpo, dpl, splits}, dn, 1, dout, dlse, nullptr);
  std::vector<float> out(hd);
  float ol;
  CUDA_OK(cudaMemcpy(out.data(), dout, hd * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&ol, dlse, 4, cudaMemcpyDeviceToHost));
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
  CUDA_OK(cudaMemcpy(dpl, empty.data(), 16, cudaMemcpyHostToDevice));
  launch_merge(sh, Partials{dpo, dpl, splits}, dn, 1, dout, dlse, nullptr);
  CUDA_OK(cudaMemcpy(out.data(), dout, hd * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(&ol, dlse, 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(out[0], 0.f);
  EXPECT_TRUE(std::isinf(ol) && ol < 0);
  cudaFree(dpo); cudaFree(dpl); cudaFree(dout); cudaFree(dlse); cudaFree(dn);
}

// The merge's int8 blocks of its output (out_int8: what the output
// projection reads) are bitwise launch_quantize_activations' of the merged
// rows -- a block of zeros, a head whose partials are all empty and
// 1e30-scale values included -- and per-sequence merges into Int8Blocks::from_row fill the same bytes
// as one merge over both sequences (decode_batch's per-engine path).
TEST(CudaDecode, MergeWritesTheInt8BlocksOfItsOutputBitwise) {
  NEED_GPU();
  const int n_seq = 2, splits = 3, group = 6, hd = 256, nq = group, cols = nq * hd;
  AttnShape sh{1, group, hd, 64, 64, 0.f};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> o(size_t(n_seq) * splits * cols), lse(size_t(n_seq) * splits * nq);
  for (size_t i = 0; i < o.size(); ++i) o[i] = nd(rng) * (i % 97 == 0 ? 1e30f : 1.f);
  for (int c = 0; c < 32; ++c)  // sequence 0, head 0, block 3: zero in every split
    for (int j = 0; j < splits; ++j) o[size_t(j) * cols + 96 + size_t(c)] = 0.f;
  for (size_t i = 0; i < lse.size(); ++i) lse[i] = nd(rng);
  for (int j = 0; j < splits; ++j) lse[(size_t(1) * splits + j) * nq + 2] = -INFINITY;  // sequence 1, head 2: O = 0
  const std::vector<int32_t> n = {splits, splits};
  const size_t ws_bytes = matvec_workspace_bytes(cols, n_seq);
  float *dpo, *dpl, *dout;
  int32_t* dn;
  void *ws_merge, *ws_quant, *ws_rows;
  CUDA_OK(cudaMalloc(&dpo, o.size() * 4));
  CUDA_OK(cudaMalloc(&dpl, lse.size() * 4));
  CUDA_OK(cudaMalloc(&dout, size_t(n_seq) * cols * 4));
  CUDA_OK(cudaMalloc(&dn, n.size() * 4));
  for (void** w : {&ws_merge, &ws_quant, &ws_rows}) {
    CUDA_OK(cudaMalloc(w, ws_bytes));
    CUDA_OK(cudaMemset(*w, 0x5a, ws_bytes));
  }
  CUDA_OK(cudaMemcpy(dpo, o.data(), o.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dpl, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dn, n.data(), n.size() * 4, cudaMemcpyHostToDevice));
  launch_merge(sh, Partials{dpo, dpl, splits}, dn, n_seq, dout, nullptr, nullptr,
               matvec_int8_blocks(ws_merge, cols, n_seq));
  launch_quantize_activations(dout, cols, n_seq, ws_quant, nullptr);
  const Int8Blocks rows = matvec_int8_blocks(ws_rows, cols, n_seq);
  for (int s = 0; s < n_seq; ++s)
    launch_merge(sh, Partials{dpo + size_t(s) * splits * cols, dpl + size_t(s) * splits * nq, splits}, dn + s, 1,
                 dout, nullptr, nullptr, rows.from_row(s, cols));
  std::vector<uint8_t> a(ws_bytes), b(ws_bytes), c(ws_bytes);
  CUDA_OK(cudaMemcpy(a.data(), ws_merge, ws_bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(b.data(), ws_quant, ws_bytes, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(c.data(), ws_rows, ws_bytes, cudaMemcpyDeviceToHost));
  EXPECT_TRUE(a == b) << "the merge's int8 blocks differ from launch_quantize_activations'";
  EXPECT_TRUE(c == b) << "per-sequence merges into from_row differ";
  // The zero block's scale is 0 and its codes 0 (the quantiser's amax == 0 case).
  const Int8Blocks host{reinterpret_cast<int8_t*>(a.data()),
                        reinterpret_cast<float*>(a.data() + (reinterpret_cast<uint8_t*>(rows.scales) -
                                                             static_cast<uint8_t*>(ws_rows)))};
  EXPECT_EQ(host.scales[2 * 3], 0.f);
  EXPECT_EQ(host.codes[96], 0);
  for (void* p : {static_cast<void*>(dpo), static_cast<void*>(dpl), static_cast<void*>(dout),
                  static_cast<void*>(dn), ws_merge, ws_quant, ws_rows})
    cudaFree(p);
}

// The pinned pool's blocks, small and large: zeroed, page-locked host
// memory whose device address is its host address (the K/V write and the
// CPU share's partials rely on it), written by the GPU through that address
// and returned.
TEST(PinnedHostMemory, BlocksAreZeroedAndMappedAtTheirHostAddress) {
  NEED_GPU();
  for (const size_t bytes : {size_t(4096), (size_t(6) << 20) + 100}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes");
    PinnedHostMemory& m = pinned_host_memory();
    std::byte* p = m.allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p[0] == std::byte{0} && p[bytes / 2] == std::byte{0} && p[bytes - 1] == std::byte{0});
    cudaPointerAttributes a{};
    CUDA_OK(cudaPointerGetAttributes(&a, p));
    EXPECT_EQ(a.type, cudaMemoryTypeHost);
    EXPECT_EQ(a.devicePointer, static_cast<void*>(p));
    CUDA_OK(cudaMemset(p + bytes - 1000, 0x7f, 1000));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(p[bytes - 1], std::byte{0x7f});
    EXPECT_EQ(p[bytes - 1001], std::byte{0});
    m.free(p, bytes);
  }
}

TEST(CudaDecode, RejectsBadArguments) {
  EXPECT_THROW((AttnShape{4, 6, 96, 1024, 512, 0.f}.validate()), InvalidArgument);
  EXPECT_NO_THROW((AttnShape{4, 6, 128, 1024, 512, 0.f}.validate()));
  EXPECT_THROW((AttnShape{4, 9, 256, 1024, 512, 0.f}.validate()), InvalidArgument);
  EXPECT_THROW((AttnShape{4, 6, 256, 1024, 300, 0.f}.validate()), InvalidArgument);
  NEED_GPU();
  AttnShape sh{1, 2, 64, 16, 16, 0.f};
  kv::PageStore store(kv::KvShape{1, sh.n_kv_heads, sh.head_dim, sh.page_size}, 4, &pinned_host_memory());
  std::vector<PageRef> pages;
  for (int i = 0; i < 4; ++i) {
    const kv::PageId id = store.allocate();
    activekv::testing::fill_random_bf16(store.page_data(id), sh.page_bytes(), 20 + uint64_t(i));
    pages.push_back(PageRef{store.page_data(id), nullptr, sh.page_bytes(), PageKind::bf16});
  }
  EngineConfig ec;
  ec.n_layers = 1;
  ec.attn = sh;
  DecodeEngine eng(ec);
  EXPECT_THROW(eng.begin_step(), InvalidArgument) << "no batch before the first update";
  SeqPages good;
  good.n_tokens = 40;  // needs 3 pages
  good.tables = {{pages[0], pages[1], pages[2]}};
  // Each bad batch follows a good one: update() throws InvalidArgument whose
  // message names the problem, and leaves no batch (a step throws).
  auto rejected = [&](const std::vector<SeqPages>& bad, const std::string& says) {
    eng.update({good});
    EXPECT_NO_THROW(eng.begin_step()) << says;
    try {
      eng.update(bad);
      ADD_FAILURE() << "accepted a batch that should fail with \"" << says << "\"";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << "message: " << e.what();
    }
    EXPECT_THROW(eng.begin_step(), InvalidArgument) << says << ": a failed update leaves no batch";
  };
  auto with_tail = [&](PageRef tail) {
    SeqPages sp = good;
    sp.tables[0][2] = tail;
    return std::vector<SeqPages>{sp};
  };
  SeqPages short_table = good;
  short_table.tables[0].pop_back();
  rejected({short_table}, "page table has 2 pages, 3 needed");
  rejected(with_tail(PageRef{nullptr, nullptr, sh.page_bytes(), PageKind::bf16}), "no host bytes");
  rejected(with_tail(PageRef{pages[2].host + 8, nullptr, sh.page_bytes(), PageKind::bf16}), "not 16-byte aligned");
  // A device address is only checked, never read, when the update fails.
  rejected(with_tail(PageRef{pages[2].host, reinterpret_cast<const void*>(uintptr_t(4104)), sh.page_bytes(),
                             PageKind::bf16}),
           "not 16-byte aligned");
  rejected(with_tail(PageRef{pages[2].host, nullptr, 100, PageKind::bf16}), "bf16 page of 100 bytes");
  rejected(with_tail(PageRef{pages[2].host, nullptr, sh.page_bytes(), PageKind::int8s}), "not a codec blob");
  rejected({}, "empty batch");
  SeqPages two_layers = good;
  two_layers.tables.push_back(good.tables[0]);
  rejected({two_layers}, "has 2 page tables, the model has 1 layers");
  SeqPages negative = good;
  negative.n_tokens = -1;
  rejected({negative}, "n_tokens < 0");
  // A good batch after a failure runs again.
  eng.update({good});
  EXPECT_NO_THROW(eng.begin_step());
  ec.ring_slots = 1;
  EXPECT_THROW(DecodeEngine{ec}, InvalidArgument);
  ec.ring_slots = 2;
  ec.tile_pages = -1;
  EXPECT_THROW(DecodeEngine{ec}, InvalidArgument);
}

}  // namespace
}  // namespace activekv::cuda
