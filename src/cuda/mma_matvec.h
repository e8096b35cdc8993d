// Internal to the CUDA backend: the tensor-core matvec for 2..8 vectors
// (mma_matvec.cu) over split matrices of Q4_0, Q4_1 and Q8_0, bitwise the
// register kernel's y (the same per-lane sums and the same butterfly, read
// off the mma's exact int32 block dots). mvhost::mma_for(n_vec) says when;
// register_matvec.cu routes there. Nothing here checks arguments again.
#pragma once

#include <cuda_runtime.h>

#include "activekv/cuda/quant_matvec.h"
#include "quant_dot.cuh"

namespace activekv::cuda::mvkern {
struct GroupArgs;  // matvec_kernel_util.cuh (device code: not for host-compiled tests)
}  // namespace activekv::cuda::mvkern

namespace activekv::cuda::mmamv {

/// Whether run would take w at n_vec vectors: the mode takes n_vec
/// (mvhost::mma_for: by default 8 vectors), 2 <= n_vec <=
/// kMaxMatvecVectors, w is split, of Q4_0/Q4_1/Q8_0, at most 8192 columns,
/// payload and head rows whole 16-byte pieces. Host only, no device asked
/// (tests ask it, so a silent fallback cannot pass for the kernel). On a
/// device with less shared memory a CTA than sm_90's 227 KiB, run may still
/// decline a matrix whose x and 4 pieces do not fit.
bool reads(const DeviceMatrix& w, int n_vec);

/// y = W x for n_vec >= 2 vectors (x prequantised in xq) and true where
/// reads(w, n_vec) and x with 4 pieces fits the current device's shared
/// memory a CTA; false and nothing launched otherwise (the caller runs the
/// register kernel).
bool run(const DeviceMatrix& w, const qdot::XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream);

/// The grouped launch over matrices like w0 (g's cta_end is recomputed for
/// this kernel's tiles of 16 rows); false where run would be.
bool run_group(const mvkern::GroupArgs& g, const DeviceMatrix& w0, const qdot::XQuant& xq, int n_vec,
               cudaStream_t stream);

/// Pieces the kernel keeps in flight for w at n_vec vectors on a device
/// whose CTAs may have `smem_bytes` of shared memory (the opt-in maximum;
/// sm_90: 232448): 8, 4, or 0 where x and 4 pieces do not fit (then run
/// declines w). Host arithmetic, for tests.
int ring_stages(const DeviceMatrix& w, int n_vec, int smem_bytes);

/// For tests: at most `ctas` CTAs a launch (0: one per SM, the default),
/// so that small matrices still give each CTA several tiles and the ring
/// wraps across tiles.
void set_grid_cap(int ctas);

}  // namespace activekv::cuda::mmamv
