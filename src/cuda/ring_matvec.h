// Internal to the CUDA backend: the ring matvec (ring_matvec.cu), one
// vector over a split matrix, each warp a run of rows whose items travel by
// cp.async through a ring of shared-memory slots (quant_ring.cuh) while it
// sums the ones that have arrived. mvhost::ring_stages() turns it on;
// regmv::run routes there. Nothing here checks arguments again.
#pragma once

#include <cuda_runtime.h>

#include "activekv/cuda/quant_matvec.h"
#include "quant_dot.cuh"

namespace activekv::cuda::ringmv {

/// y = W x (one vector, x prequantised in xq) for a split matrix of a type
/// the ring reads, with mvhost::ring_stages() stages, and true; false (and
/// nothing launched) for another type or with the ring off. Bitwise the
/// register kernel's y.
bool run(const DeviceMatrix& w, const qdot::XQuant& xq, float* y, bool accumulate, cudaStream_t stream);

}  // namespace activekv::cuda::ringmv
