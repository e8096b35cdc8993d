// Internal to the CUDA backend: the batched decode matvec on int8 tensor
// cores (quant_matvec_tc.cu), for 2..8 vectors of a block type whose work
// items are its 32-element units (every block type but Q6_K).
//
// Why: with several vectors the chunked kernel's dp4a work grows with the
// vectors while the weight bytes do not -- at 8 vectors Q4_0 17408x5120 read
// its weights at 1.0 TB/s (22 % of HBM) even with 4 rows per warp (H200,
// cb7140c). One mma.m16n8k32.s8 takes a unit of 16 rows x 8 vectors.
//
// Bits: the same as the chunked kernel's, so batch == solo holds and the CPU
// emulation (tests/cuda/matvec_emulation.h) checks it. Each unit's integer
// dot is exact either way; its float epilogue is dot_unit_x's; and the units
// of a row are summed in the chunked kernel's order: 32 lane partials, lane
// l holding units l, l + 32, l + 64, ... in order, then the warp's xor
// butterfly (16, 8, 4, 2, 1) -- here slot l of a CTA of 4 warps, warp w
// owning slots 8w..8w+7, and the butterfly replayed as a tree in shared
// memory. ACTIVEKV_MATVEC_TC=0 in the environment turns it off (A/B runs).
#pragma once

#include <cuda_runtime.h>

#include "activekv/cuda/quant_matvec.h"
#include "quant_dot.cuh"

namespace activekv::cuda::mvtc {

/// Rows of a CTA (one m16 tile).
inline constexpr int kRowsPerCta = 16;

/// Whether the tensor-core kernel takes a launch of n_vec vectors of type t:
/// 2 <= n_vec <= 8, a block type other than Q6_K, not turned off.
bool takes(gguf::TensorType t, int n_vec);

/// y[v * w.rows + r] (+)= row r of w . x_v for v < n_vec, from x quantised
/// in xq (launch_quantize_activations' layout). Enqueued on `stream`.
void launch(const DeviceMatrix& w, int n_vec, const qdot::XQuant& xq, float* y, bool accumulate, cudaStream_t stream);

/// launch_matvec_prequantized_group's work in one launch (n matrices of one
/// type and cols, checked by the caller; outputs not accumulated).
void launch_group(const MatvecGroupItem* items, int n, int n_vec, const qdot::XQuant& xq, cudaStream_t stream);

}  // namespace activekv::cuda::mvtc
