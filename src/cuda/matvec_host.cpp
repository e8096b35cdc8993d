// Host half of the matvec launches (matvec_host.h).
#include "matvec_host.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "activekv/core/error.h"

namespace activekv::cuda::mvhost {

bool is_float_type(gguf::TensorType t) {
  return t == gguf::TensorType::F32 || t == gguf::TensorType::F16 || t == gguf::TensorType::BF16;
}

std::string shape_str(const DeviceMatrix& w) {
  return gguf::type_name(w.type) + (w.layout == WeightLayout::Split ? " matrix (split layout) of " : " matrix of ") +
         std::to_string(w.rows) + " rows x " +
         std::to_string(w.cols) + " cols";
}

void check_nvec(int n_vec) {
  if (n_vec < 1 || n_vec > kMaxMatvecVectors) {
    throw InvalidArgument("matvec: n_vec " + std::to_string(n_vec) + " is outside 1.." +
                          std::to_string(kMaxMatvecVectors));
  }
}

void check_matvec_args(const DeviceMatrix& w, const float* x, bool need_x, int n_vec, const float* y,
                       const void* ws, bool quantises_x) {
  validate_matrix(w);
  check_nvec(n_vec);
  if ((need_x && x == nullptr) || y == nullptr) {
    throw InvalidArgument("matvec on " + shape_str(w) + ": x or y is null");
  }
  if (is_float_type(w.type)) {
    if (reinterpret_cast<uintptr_t>(x) % 16 != 0) {
      throw InvalidArgument("matvec on " + shape_str(w) + ": x must be 16-byte aligned");
    }
  } else if (quantises_x && (ws == nullptr || reinterpret_cast<uintptr_t>(ws) % 256 != 0)) {
    throw InvalidArgument("matvec on " + shape_str(w) + ": the workspace must be non-null and 256-byte aligned");
  }
}

namespace {

/// ACTIVEKV_MATVEC_ROWS=1|2|4, else 0 (read once).
int forced_rows() {
  static const int r = [] {
    const char* e = std::getenv("ACTIVEKV_MATVEC_ROWS");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 ? v : 0;
  }();
  return r;
}

std::string group_item(int i, const DeviceMatrix& w) {
  return "matrix " + std::to_string(i) + " (" + shape_str(w) + ")";
}

/// Throws if two outputs [y, y + n_vec * rows) share a byte: the launch
/// writes them concurrently, where separate launches would write in order.
void check_disjoint(const MatvecGroupItem* items, int n, int n_vec) {
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const auto a = reinterpret_cast<uintptr_t>(items[i].y), b = reinterpret_cast<uintptr_t>(items[j].y);
      const uintptr_t na = sizeof(float) * uintptr_t(n_vec) * uintptr_t(items[i].w->rows);
      const uintptr_t nb = sizeof(float) * uintptr_t(n_vec) * uintptr_t(items[j].w->rows);
      if (na > 0 && nb > 0 && a < b + nb && b < a + na) {
        throw InvalidArgument("matvec group: the outputs of matrices " + std::to_string(i) + " and " +
                              std::to_string(j) + " overlap");
      }
    }
  }
}

}  // namespace

namespace {
int initial_split_depth() {
  const char* e = std::getenv("ACTIVEKV_SPLIT_DEPTH");
  return e == nullptr ? 0 : std::strcmp(e, "1") == 0 ? 1 : std::strcmp(e, "2") == 0 ? 2 : 0;
}
std::atomic<int> g_split_depth{initial_split_depth()};
}  // namespace

void set_split_depth(int depth) {
  if (depth < 0 || depth > 2)
    throw InvalidArgument("register matvec: split depth " + std::to_string(depth) + " is not 0 (the rule), 1 or 2");
  g_split_depth.store(depth, std::memory_order_relaxed);
}
int split_depth() { return g_split_depth.load(std::memory_order_relaxed); }

namespace {
/// ACTIVEKV_WIDE_ROWS=2: wide matrices keep the chunked rule's rows, as
/// before the wide rule (A/B measurements; read once).
bool wide_rows_before() {
  static const bool before = [] {
    const char* e = std::getenv("ACTIVEKV_WIDE_ROWS");
    return e != nullptr && std::strcmp(e, "2") == 0;
  }();
  return before;
}
}  // namespace

namespace {
std::atomic<MmaMatvec> g_mma_matvec{[] {
  const char* e = std::getenv("ACTIVEKV_MATVEC_MMA");
  if (e != nullptr && std::strcmp(e, "0") == 0) return MmaMatvec::Off;
  if (e != nullptr && std::strcmp(e, "1") == 0) return MmaMatvec::On;
  return MmaMatvec::Rule;
}()};
}  // namespace

void set_mma_matvec(MmaMatvec mode) { g_mma_matvec.store(mode, std::memory_order_relaxed); }
MmaMatvec mma_matvec() { return g_mma_matvec.load(std::memory_order_relaxed); }
bool mma_for(int n_vec) {
  switch (mma_matvec()) {
    case MmaMatvec::Off: return false;
    case MmaMatvec::On: return n_vec >= 2;
    case MmaMatvec::Rule: return n_vec >= 8;
  }
  return false;
}

SplitShape split_shape(int64_t rows, int64_t cols, int n_vec, int block_bytes, int block_elems) {
  const int forced = split_depth();
  const bool four_bit = 8 * block_bytes <= 5 * block_elems;
  if (forced == 0 && forced_rows() == 0 && n_vec == 1 && four_bit) {
    if (rows >= 16384 && cols <= 8192) return {1, 2};  // tall
    if (cols > 8192 && !wide_rows_before()) return {1, 1};  // wide
  }
  // Q6_K (6.56 bits): 8 items in flight per lane for one vector unless wide.
  // Measured on the H200 (session 13, 8c8ef6d, one call): 32000x5120 63.2 ->
  // 50.5 us, 17408x5120 36.8 -> 30.4, 6144x5120 16.2 -> 14.6, 1024x5120 5.8
  // -> 5.5; the wide 5120x17408 36.2 -> 42.7 keeps depth 1.
  const bool six_bit = !four_bit && block_elems == 256;  // of the split types, Q6_K
  if (forced == 0 && forced_rows() == 0 && n_vec == 1 && six_bit && cols <= 8192) return {1, 2};
  return {register_rows_per_warp(rows, cols, n_vec, block_bytes, block_elems), forced == 2 && n_vec == 1 ? 2 : 1};
}

int register_rows_per_warp(int64_t rows, int64_t cols, int n_vec, int block_bytes, int block_elems) {
  const int r = chunked_rows_per_warp(rows, n_vec, block_bytes, block_elems);
  if (r == 4 && forced_rows() == 0 && (block_elems == 32 || cols > 8192)) return 2;
  return r;
}

int chunked_rows_per_warp(int64_t rows, int n_vec, int block_bytes, int block_elems) {
  if (const int f = forced_rows(); f != 0) return f == 4 && n_vec != kRowsFourVectors ? 2 : f;
  const bool four_bit = 8 * block_bytes <= 5 * block_elems;  // <= 5 bits per element with the scales
  if (rows < 4096) return 1;
  if (n_vec > 1) return n_vec == kRowsFourVectors && four_bit ? 4 : 2;
  return four_bit ? 2 : 1;
}

bool reads_registers(const DeviceMatrix& w) { return w.layout == WeightLayout::Split; }

GroupPlan plan_group(const MatvecGroupItem* items, int n, const float* x, int n_vec, const void* workspace,
                     BlockMatvecKernel kernel) {
  if (items == nullptr || n < 1 || n > kMaxMatvecGroup) {
    throw InvalidArgument("matvec group: " + std::to_string(items ? n : 0) + " matrices (1.." +
                          std::to_string(kMaxMatvecGroup) + " allowed)");
  }
  for (int i = 0; i < n; ++i) {
    if (items[i].w == nullptr || items[i].y == nullptr) {
      throw InvalidArgument("matvec group: matrix " + std::to_string(i) + " has a null matrix or output");
    }
  }
  const DeviceMatrix& w0 = *items[0].w;
  const bool is_float = is_float_type(w0.type);
  for (int i = 0; i < n; ++i) {
    const DeviceMatrix& w = *items[i].w;
    if (w.type != w0.type || w.cols != w0.cols || w.layout != w0.layout) {
      throw InvalidArgument("matvec group: " + group_item(i, w) + " does not match " + group_item(0, w0) +
                            ": one type, layout and column count per group");
    }
    check_matvec_args(w, x, is_float, n_vec, items[i].y, workspace);
  }
  check_disjoint(items, n, n_vec);

  GroupPlan p;
  p.n = n;
  // The chunked and register kernels' rows do not depend on the grid (split
  // matrices always run the register kernel).
  p.registers = true;
  for (int i = 0; i < n; ++i) p.registers = p.registers && reads_registers(*items[i].w);
  p.one_launch = is_float || kernel != BlockMatvecKernel::Tiled || p.registers;
  int64_t total_rows = 0;
  for (int i = 0; i < n; ++i) total_rows += items[i].w->rows;
  if (!is_float) {
    const int bb = int(gguf::block_bytes(w0.type)), be = int(gguf::block_elements(w0.type));
    p.rows_per_warp = p.registers ? register_rows_per_warp(total_rows, w0.cols, n_vec, bb, be)
                                  : chunked_rows_per_warp(total_rows, n_vec, bb, be);
  }
  int64_t end = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t warps = (items[i].w->rows + p.rows_per_warp - 1) / p.rows_per_warp;
    end += (warps + kWarpsPerCta - 1) / kWarpsPerCta;
    if (end > int64_t(INT32_MAX)) throw InvalidArgument("matvec group: too many rows for one launch");
    p.cta_end[i] = uint32_t(end);
  }
  return p;
}

}  // namespace activekv::cuda::mvhost
