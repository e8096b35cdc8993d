// GPU kernels on weights kept in their GGUF types: decode matvec, embedding
// gather and dequantisation to bf16 (the prefill GEMM's input, weight_gemm.h).
//
// A weight tensor with GGUF dims [cols, rows] is `rows` rows of `cols`
// elements; each row is cols / block_elements(type) blocks laid out exactly as
// in the GGUF file (ggml-common.h; our CPU decoder is src/gguf/dequant*.cpp).
// The device copy is those bytes (no fp32 copy exists anywhere), in the GGUF
// layout or, for Q4_0, Q4_1, Q5_0, Q8_0 and Q6_K, in the split layout
// (WeightLayout below) that the model's weights use.
//
// Types with a kernel: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K
// (every type gguf::TensorType names).
//
// Matvec arithmetic. Float weights (F32/F16/BF16): fp32 activations, fp32 FMA.
// Block types: each 32-element block of x is quantised to int8 (the "q8_1"
// idea): amax = max|x_i|, q_i = round_half_even(x_i * (127 / amax)) (0 when
// amax == 0), d = amax / 127, all in fp32; the block keeps d and sum_i q_i. The
// dot of a weight block is then integer (__dp4a) with the scales applied per
// block (per 16 elements for Q6_K), the mins of Q4_1/Q4_K/Q5_K through sum q_i.
// So y = sum_i w_i * d*q_i up to fp32 rounding, where w_i is gguf::dequantize's
// value; the activation rounding |x_i - d*q_i| <= d/2 is the only other error
// (tests/cuda/test_weights.cpp bounds both).
//
// Everything is asynchronous on the given stream. Bad arguments throw
// activekv::InvalidArgument naming what is wrong; CUDA errors throw
// activekv::cuda::CudaError (decode_attention.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "activekv/cuda/decode_attention.h"
#include "activekv/gguf/tensor_type.h"

namespace activekv::cuda {

/// How a matrix's blocks sit in device memory.
///   Gguf:  row r at data + r * row_bytes, its blocks as in the GGUF file.
///   Split: (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K only) the same bytes in two
///          regions: the payload of every block, [rows][blocks per row][P],
///          then the rest of every block, [rows][blocks per row][H]. For the
///          32-element types the payload is the codes, each block's last P
///          bytes: P = 16 (32 for Q8_0), H = 2 (Q4_0, Q8_0), 4 (Q4_1), 6
///          (Q5_0). For Q4_K it is the 144-byte super-block's 128 bytes of
///          nibbles regrouped by unit (unit u's 32 codes in bytes 16u ..
///          16u + 15, Q4_0's order), H = 16 (d, dmin, scales). For Q6_K it is
///          each 210-byte super-block's first P = 208
///          bytes (ql, qh, scales), H = 2 (d). Payloads are then 16-byte
///          aligned: the matvec reads them with aligned loads straight from
///          global memory instead of staging 2-byte aligned rows through
///          shared memory (src/cuda/quant_split.cuh). Every kernel gives the
///          same bits on either layout.
/// launch_repack_split writes the split layout from the GGUF one.
enum class WeightLayout : uint8_t { Gguf, Split };

/// A weight matrix on the device, bytes as in the GGUF file (`layout`).
/// Requirements (checked by every launch_*): `type` has a kernel, cols > 0 is a
/// multiple of block_elements(type) (and of 8 for F32/F16/BF16), row_bytes ==
/// gguf::row_bytes(type, cols), rows >= 0, a Split layout only for a type
/// with has_split_layout, and `data` is 16-byte aligned
/// (cudaMalloc is; a tensor at a GGUF offset inside one upload buffer is when
/// the file's alignment is a multiple of 16 -- the default, 32, is). In the
/// GGUF layout row r starts at data + r * row_bytes (rows need not be 16-byte aligned: Q6_K's
/// 210-byte blocks rarely are).
struct DeviceMatrix {
  gguf::TensorType type = gguf::TensorType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  WeightLayout layout = WeightLayout::Gguf;
};

/// True for the types with a split layout: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K.
bool has_split_layout(gguf::TensorType t);

/// Whether matrices of those types are stored split: yes, unless
/// ACTIVEKV_WEIGHT_LAYOUT=gguf (A/B measurements; the runtime's GpuWeights
/// and bench_matvec both ask). Throws InvalidArgument for another value.
bool split_layout_wanted();

/// Writes dst (dst.layout == Split, a type with has_split_layout, valid as
/// validate_matrix checks) from the same matrix in the GGUF layout at
/// `src_gguf` (device, dst.rows * dst.row_bytes bytes, not overlapping
/// dst.data). Throws InvalidArgument otherwise. Asynchronous on `stream`.
void launch_repack_split(const void* src_gguf, const DeviceMatrix& dst, cudaStream_t stream);

/// Most vectors one matvec launch takes (batched decode).
inline constexpr int kMaxMatvecVectors = 8;

/// The block-type matvec kernel launch_matvec and launch_matvec_prequantized
/// use. Every matrix in the split layout (WeightLayout::Split) runs the
/// register kernel whatever is selected: its weights load straight into
/// registers in aligned 16-byte (8-byte for Q6_K) loads, no shared memory;
/// its rows are bitwise the chunked kernel's (each lane meets the same work
/// items -- 32-element units; Q6_K's 8 columns of 4 units -- in the same
/// order). For matrices in the GGUF layout:
///   Chunked (the default): a warp per row streamed through shared memory.
///   Tiled: a thread per 256-element tile, all of its bytes loaded before
///     any use, R rows per CTA -- measured slower on the H200 at af92df1
///     (Q4_0 at 18-28 % of HBM read against the chunked kernel's 26-49 %;
///     the 27B-shape model at depth 0 3.88 ms/token against 2.73:
///     bench/results/h200_bench_matvec_tiled.json,
///     h200_model_bench_d0_tiled.json), kept for that work to continue
///     (bench_matvec --kernel tiled). It sums in another order, so its y
///     differs from the others' in the last bits; each is deterministic.
/// The process starts with ACTIVEKV_MATVEC_KERNEL=tiled from the
/// environment, else Chunked. (A third choice, Register, read Q4_K's GGUF
/// layout through registers: 48 bytes of registers per 18-byte unit, it
/// lost to Chunked -- the 27B-shape Q4_K model at depth 0 2.028 against
/// 1.853 ms/token, bench/results/h200_q4k_register_model_b6cb9a6.json --
/// and Q4_K's split layout replaced it.)
/// Process-wide: set it before launching, not while other threads launch.
enum class BlockMatvecKernel { Tiled, Chunked };
void set_block_matvec_kernel(BlockMatvecKernel k);
BlockMatvecKernel block_matvec_kernel();

/// True for the types listed above.
bool has_gpu_kernel(gguf::TensorType t);

/// Throws InvalidArgument("tensor '<name>': no GPU kernel for weight type <T>
/// (GPU types: ...)") unless has_gpu_kernel(t). For checks at model load time.
void require_gpu_kernel(const std::string& tensor_name, gguf::TensorType t);

/// Throws InvalidArgument naming type, rows and cols if `w` breaks a
/// requirement of DeviceMatrix (the launches call it; exposed for load-time checks).
void validate_matrix(const DeviceMatrix& w);

/// Device scratch bytes launch_matvec needs for `n_vec` vectors of `cols`
/// elements (the int8 activations and their per-block scales); enough for every
/// weight type. 0 < n_vec <= kMaxMatvecVectors, cols a multiple of 32 (else InvalidArgument).
size_t matvec_workspace_bytes(int64_t cols, int n_vec);

/// y[v][r] = (accumulate ? y[v][r] : 0) + sum_c W[r][c] * x[v][c]
/// for v < n_vec (1..kMaxMatvecVectors), r < w.rows.
///   x: device fp32 [n_vec][w.cols] (finite), y: device fp32 [n_vec][w.rows]
///   workspace: device, >= matvec_workspace_bytes(w.cols, n_vec) bytes, 256-byte
///   aligned (cudaMalloc'd); may be null for F32/F16/BF16 weights.
/// `accumulate` adds to y in place (fp32: y + dot), e.g. the residual x += W_o . attn.
/// y must not overlap x or the workspace. Block types quantise x first (see the
/// file comment); two launches on one stream may share the workspace.
void launch_matvec(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate,
                   void* workspace, cudaStream_t stream);

/// The two halves of launch_matvec for block types, so that one quantised x
/// feeds several matrices of the same cols (Q, K and V; gate and up):
/// launch_quantize_activations writes x's int8 blocks into `workspace`;
/// launch_matvec_prequantized reads them (the workspace must hold that x, for
/// the same cols and n_vec, when the kernel runs). For F32/F16/BF16 weights the
/// prequantized launch uses `x` itself, exactly like launch_matvec.
void launch_quantize_activations(const float* x, int64_t cols, int n_vec, void* workspace,
                                 cudaStream_t stream);

/// Where launch_quantize_activations(x, cols, n_vec, workspace) puts x's int8
/// blocks (decode_attention.h's Int8Blocks), for kernels that write them
/// themselves (launch_merge). Requirements as matvec_workspace_bytes; the
/// workspace non-null and 256-byte aligned (else InvalidArgument).
Int8Blocks matvec_int8_blocks(void* workspace, int64_t cols, int n_vec);
void launch_matvec_prequantized(const DeviceMatrix& w, const float* x, int n_vec, float* y,
                                bool accumulate, const void* workspace, cudaStream_t stream);

/// One matrix of launch_matvec_prequantized_group and its output
/// y: device fp32 [n_vec][w->rows].
struct MatvecGroupItem {
  const DeviceMatrix* w = nullptr;
  float* y = nullptr;
};

/// Most matrices one grouped launch takes (Q, K, V: 3; gate, up: 2).
inline constexpr int kMaxMatvecGroup = 4;

/// y_i = W_i x for i < n (accumulate = false) in ONE kernel launch: the
/// matrices that read the same input rows -- Q, K and V after the attention
/// RMSNorm, gate and up after the FFN's -- so that small ones (the 1024-row K
/// and V) share the GPU with the big one instead of each under-filling it.
/// The grid covers every matrix's rows, each CTA working on rows of one
/// matrix with the single-matrix kernel's per-row code.
///
/// Accepts 1 <= n <= kMaxMatvecGroup items with non-null w and y, every
/// matrix of the SAME type, layout and cols (rows may differ, 0 included),
/// each valid (validate_matrix), outputs not overlapping one another; x,
/// n_vec and the workspace as launch_matvec_prequantized (the workspace holds
/// x quantised for that cols and n_vec; x is read only for F32/F16/BF16
/// weights, where it must be 16-byte aligned). Anything else throws
/// InvalidArgument in one line naming the matrix and what is wrong, before
/// anything is launched.
///
/// Result: every y_i is bitwise what launch_matvec_prequantized(*w_i, x,
/// n_vec, y_i, false, workspace, stream) writes. Rows per warp (the chunked
/// kernel's R, 2 for 4-bit types on tall matrices) are chosen once for the
/// launch from the rows of all matrices together -- the rule exists to have
/// warps enough to fill the GPU, which is the launch's total -- so a small
/// matrix may run with R = 2 in a group and R = 1 alone; each row's sum does
/// not depend on R (quant_matvec.cu), so the bits are the same.
/// With BlockMatvecKernel::Tiled (whose row sums depend on its per-matrix
/// CTA geometry) the group runs as one launch per matrix instead.
void launch_matvec_prequantized_group(const MatvecGroupItem* items, int n, const float* x, int n_vec,
                                      const void* workspace, cudaStream_t stream);

/// cuda::rms_norm (model_ops.h) of x [T][n] into out and, in the same
/// kernel, out's int8 blocks into `workspace` as launch_quantize_activations(
/// out, n, T, workspace) writes them -- both bitwise -- so the matvecs that
/// read the normalised rows (launch_matvec_prequantized) need no quantising
/// launch of their own. 1 <= T <= kMaxMatvecVectors, n a positive multiple of
/// 32, eps finite >= 0, pointers non-null, the workspace 256-byte aligned and
/// >= matvec_workspace_bytes(n, T) bytes (else InvalidArgument); out may
/// alias x. One launch when x, weight and out are 16-byte aligned, else two.
/// As cuda::rms_norm, weight must not be written by the kernel launched just
/// before on this stream (it is read before the programmatic wait).
void launch_rms_norm_quantize(const float* x, const float* weight, int T, int n, float eps, float* out,
                              void* workspace, cudaStream_t stream);

/// cuda::swiglu (model_ops.h) of gate, up [T][n] in place into gate and, in
/// the same kernel, gate's int8 blocks into `workspace` as
/// launch_quantize_activations(gate, n, T, workspace) writes them (both
/// bitwise): the FFN's down projection then needs no quantising launch.
/// Requirements as launch_rms_norm_quantize (T, n, workspace); gate and up
/// non-null and not overlapping. One launch when both are 16-byte aligned, else two.
void launch_swiglu_quantize(float* gate, const float* up, int T, int n, void* workspace, cudaStream_t stream);

/// The same y as launch_matvec, with the CPU reference's arithmetic for block
/// types too: each weight dequantised (bit-identical to gguf::dequantize) and
/// multiplied by the fp32 x, fp32 FMA -- no int8 rounding of x, no workspace.
/// For comparisons with the CPU path (RuntimeOptions::f32_activations); it is
/// not tuned for bandwidth. Same requirements and errors as launch_matvec, and
/// x 16-byte aligned.
void launch_matvec_f32_activations(const DeviceMatrix& w, const float* x, int n_vec, float* y, bool accumulate,
                                   cudaStream_t stream);

/// Embedding lookup: out[i][c] = dequantised W[ids[i]][c], fp32 [n][w.cols],
/// bit-identical to gguf::dequantize of that row (NaN payloads included).
/// ids: device int32 [n]. An id outside [0, w.rows) cannot be reported from
/// the device: its output row is filled with quiet NaN (0x7fc00000) instead.
/// n == 0 is a no-op.
void launch_gather_rows_f32(const DeviceMatrix& w, const int32_t* ids, int n, float* out,
                            cudaStream_t stream);

/// Rows [row0, row0 + n_rows) of W dequantised and rounded to bf16
/// (round-to-nearest-even, NaN kept quiet: activekv/core/bf16.h's rule) into
/// out_bf16 [n_rows][w.cols] (device, 16-byte aligned). Throws InvalidArgument
/// if the range is outside [0, w.rows). n_rows == 0 is a no-op.
void launch_dequantize_bf16(const DeviceMatrix& w, int64_t row0, int64_t n_rows, void* out_bf16,
                            cudaStream_t stream);

/// out_bf16[i] = bf16(x[i]) for i < n (same rounding rule), device arrays; for
/// activations entering the bf16 GEMM.
void launch_f32_to_bf16(const float* x, int64_t n, void* out_bf16, cudaStream_t stream);

}  // namespace activekv::cuda
