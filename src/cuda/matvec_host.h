// Internal to the CUDA backend: the host half of the matvec launches
// (quant_matvec.h) -- argument checks, the chunked kernel's rows-per-warp
// rule and the grid of a grouped launch -- kept apart from the kernels so
// that a test without a GPU can hold it (tests/cuda/test_weights_host.cpp).
// Plain C++ (no device code); quant_matvec.cu includes it.
#pragma once

#include <cstdint>
#include <string>

#include "activekv/cuda/quant_matvec.h"

namespace activekv::cuda::mvhost {

/// Warps per CTA of the chunked and float matvec kernels (each warp R rows).
inline constexpr int kWarpsPerCta = 4;

bool is_float_type(gguf::TensorType t);

/// "Q4_0 matrix of 6144 rows x 5120 cols", for error messages.
std::string shape_str(const DeviceMatrix& w);

/// Throws InvalidArgument("matvec: n_vec N is outside 1..8") unless 1 <= n_vec <= kMaxMatvecVectors.
void check_nvec(int n_vec);

/// The checks of one matvec launch (throw InvalidArgument): validate_matrix(w),
/// n_vec, y non-null, x non-null when `need_x`; float types need x 16-byte
/// aligned; block types (when `quantises_x`: they read x's int8 blocks) need
/// the workspace non-null and 256-byte aligned.
void check_matvec_args(const DeviceMatrix& w, const float* x, bool need_x, int n_vec, const float* y,
                       const void* ws, bool quantises_x = true);

/// Rows per warp of the chunked kernel for `rows` rows of a type of
/// `block_bytes` per `block_elems`. One vector: 2 (x loaded once for both)
/// for 4-bit types (x's 40 bytes per 32 elements are most of their L1
/// traffic) where there are rows enough (>= 4096: >= 2048 warps), else 1.
/// Measured on the H200 at f19e007 (bench/results/h200_bench_matvec_rows
/// {1,2,4}.json, % of HBM read, 1 vs 2 rows): Q4_0 6144x5120 29.9 vs 34.0,
/// 32000x5120 57.0 vs 58.9, the others within 1 point; Q8_0 lost 4-8 points
/// with 2 rows, Q6_K won or lost by shape; 4 rows lost for one vector.
/// Several vectors (a batched decode step), any type, >= 4096 rows: 2, or
/// 4 for kRowsFourVectors vectors of a 4-bit type. There x is n_vec x 40
/// bytes per 32 elements against a 4-bit block's 18: at one row per warp the
/// 8-vector Q4_0 matvec read its weights at ~0.7 TB/s, bound by x's loads;
/// each x load now serves 2 or 4 rows. Measured on the H200 at cb7140c
/// (bench/results/h200_bench_matvec_rows{0,1,2,4}_cb7140c.json, 8 vectors,
/// us for 1 / 2 / 4 rows per warp): Q4_0 17408x5120 70.2 / 49.6 / 48.0,
/// 32000x5120 124.2 / 85.3 / 82.4; Q4_K 6144x5120 29.7 / 23.2 / 20.3;
/// Q6_K 6144x5120 56.5 / 39.6 / 44.6; Q8_0 32000x5120 132.4 / 103.2 / 109.9
/// -- 4 rows win for 4-bit types only. Each row's sum is the same whatever
/// the rows per warp. ACTIVEKV_MATVEC_ROWS=1|2|4 in the environment forces
/// it (measurements; 4 becomes 2 but for kRowsFourVectors vectors, the only
/// instantiation).
constexpr int kRowsFourVectors = 8;
int chunked_rows_per_warp(int64_t rows, int n_vec, int block_bytes, int block_elems);

/// The grid of launch_matvec_prequantized_group: matrix i owns CTAs
/// [i ? cta_end[i-1] : 0, cta_end[i]), each of kWarpsPerCta warps of
/// rows_per_warp rows, so that a CTA never holds rows of two matrices and
/// its rows within the matrix are those of the single-matrix launch's CTA
/// of the same index.
struct GroupPlan {
  int n = 0;
  int rows_per_warp = 1;    // one R for the whole launch (1 for float types)
  bool one_launch = true;   // false: the tiled kernel, one launch per matrix
  bool registers = false;   // the register kernel reads every matrix (reads_registers)
  uint32_t cta_end[kMaxMatvecGroup] = {};
  uint32_t ctas() const { return n > 0 ? cta_end[n - 1] : 0; }
};

/// True where the register kernel reads w (BlockMatvecKernel's comment): the
/// split layout, whatever kernel is selected.
bool reads_registers(const DeviceMatrix& w);

/// Checks a group as launch_matvec_prequantized_group documents (throws
/// InvalidArgument, nothing launched) and lays out its grid for `kernel`.
GroupPlan plan_group(const MatvecGroupItem* items, int n, const float* x, int n_vec, const void* workspace,
                     BlockMatvecKernel kernel);

/// The register kernel's units per lane in flight for one vector: depth 1
/// (per row, 4 blocks of 16-byte codes of a split type, 2 of Q8_0's 32; 4
/// Q4_K units of 32 bytes, 1 at 4 rows; 4 Q6_K items of 34 bytes, 2 at 2
/// rows, 1 at 4) or 2 (twice as many), or 0 (the
/// default): split_shape's rule. ACTIVEKV_SPLIT_DEPTH=1|2
/// at start forces one (measurements), as does this. The same bits either
/// way (each lane meets its blocks in the same order). Process-wide, as
/// set_block_matvec_kernel. InvalidArgument for another depth.
void set_split_depth(int depth);
int split_depth();

/// Rows per warp and depth of one register-kernel launch (every split
/// type). Forced depth: that,
/// with register_rows_per_warp's rows. Else, for one vector over a tall
/// matrix of a 4-bit type (>= 16384 rows, <= 8192 cols: the FFN's gate and
/// up, the output head), 1 row per warp at depth 2 -- the same 8 blocks of 16 bytes in
/// flight per lane as 2 rows at depth 1, but over twice the warps; measured
/// on the H200 at 0331ab8 (bench/results/h200_bench_matvec_split_depth_
/// 0331ab8.json, us, 2 rows x depth 1 against 1 row x depth 2): Q4_0
/// 17408x5120 17.27 vs 15.81, 32000x5120 27.60 vs 24.29, where it lost on
/// the wide and the small ones (5120x17408 17.93 vs 21.74, 6144x5120 7.85
/// vs 8.89) and on Q8_0 (17408x5120 25.99 vs 29.73). For one vector over a
/// wide matrix of a 4-bit type (> 8192 cols: the FFN's down), 1 row per
/// warp at depth 1: 2 rows left 2560 warps for 5120 rows, and at 72
/// registers 7 CTAs per SM -- Nsight Compute at 27e9035 saw 30 % achieved
/// occupancy and 41 % of DRAM bandwidth (bench/results/
/// h200_ncu_register_matvec_27e9035.txt). Measured in one call at 0bc7a46
/// (h200_wide_rule_0bc7a46.json, alternating): Q4_0 5120x17408 18.14 / 18.17
/// us against 23.01 / 22.81 with 2 rows; the 27B-shape model at depth 0
/// 1.625 / 1.628 against 1.712 / 1.710 ms/token. ACTIVEKV_WIDE_ROWS=2 keeps
/// the chunked rule's rows there (A/B runs). For one vector over a Q6_K
/// matrix (split) of <= 8192 cols, 1 row at depth 2: measured on the H200 in
/// one call at 8c8ef6d (bench/results/h200_matvec_q6k_split_8c8ef6d.json, us,
/// depth 1 against 2): 32000x5120 63.2 vs 50.5, 17408x5120 36.8 vs 30.4,
/// 6144x5120 16.2 vs 14.6, 5120x6144 16.5 vs 15.5, where the wide 5120x17408
/// lost (36.2 vs 42.7); the Q6_K 27B-shape model at depth 0 2.654 / 2.654
/// against 2.671 / 2.665 ms/token (h200_q6k_depth_rule_d0a356c.json). Else
/// register_rows_per_warp at depth 1. ACTIVEKV_MATVEC_ROWS forces the rows as
/// there.
struct SplitShape {
  int rows_per_warp = 1;
  int depth = 1;
};
SplitShape split_shape(int64_t rows, int64_t cols, int n_vec, int block_bytes, int block_elems);

/// Rows per warp of the register kernel (split matrices) where split_shape's
/// one-vector rules do not apply, and of its grouped launch: the chunked
/// kernel's rule, but 2 rows where that says 4 (kRowsFourVectors vectors of
/// a 4-bit type) for the 32-element types and for wide matrices (> 8192
/// cols). Measured on the H200 in one call at cecbfa3 (bench/results/
/// h200_matvec_rows2_nv8_cecbfa3.json, 8 vectors, us at 4 / 2 rows): Q4_0
/// 6144x5120 23.60 / 18.16, 5120x6144 26.71 / 18.87, 17408x5120 52.78 /
/// 44.21, 5120x17408 69.01 / 44.44, 32000x5120 85.50 / 76.83, the QKV group
/// 24.88 / 23.01 -- at 4 rows the register kernel lost to the chunked one on
/// the GGUF layout (h200_q4k_layout_nvec_cecbfa3.json); Q4_K 5120x17408
/// 55.33 / 47.49, but 17408x5120 44.03 / 48.58, 32000x5120 73.42 / 84.27,
/// the QKV group 20.23 / 25.33, 6144x5120 20.24 / 19.68 (kept at 4: < 3 %).
/// Q4_1 follows Q4_0 unmeasured. ACTIVEKV_MATVEC_ROWS forces the rows as
/// for the chunked rule.
int register_rows_per_warp(int64_t rows, int64_t cols, int n_vec, int block_bytes, int block_elems);

/// Which vector counts over a split Q4_0, Q4_1 or Q8_0 matrix take the
/// tensor-core kernel (mma_matvec.cu) instead of the register kernel; the
/// same bits either way.
///   Rule (the default): 8 vectors. Measured on the H200 at 4247b23
///     (bench/results/h200_matvec_mma_4247b23.json, us, mma / register):
///     at 8 vectors 0.75-0.90x on every matrix it takes (Q4_0 17408x5120
///     36.1 / 44.3, Q8_0 39.5 / 49.1), the 27B-shape model's 8-sequence
///     step 3.21 / 3.70 ms; at 2 and 4 vectors 1.4-3.2x slower (its time
///     hardly depends on the count). 5..7: unmeasured, left to the register kernel.
///   Off: never (ACTIVEKV_MATVEC_MMA=0).  On: 2..8 vectors (ACTIVEKV_MATVEC_MMA=1; A/B, tests).
/// Read from the environment at start; process-wide, as set_split_depth.
enum class MmaMatvec { Off, Rule, On };
void set_mma_matvec(MmaMatvec mode);
MmaMatvec mma_matvec();
/// Whether n_vec vectors take the tensor-core kernel under the mode (where
/// it reads the matrix: mmamv::reads).
bool mma_for(int n_vec);

}  // namespace activekv::cuda::mvhost
