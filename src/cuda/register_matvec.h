// Internal to the CUDA backend: the register matvec (register_matvec.cu) --
// the block-type matvec whose weights load straight into registers -- for
// the matrices it reads (mvhost::reads_registers: the split layout,
// WeightLayout::Split and quant_split.cuh, and Q4_K in its GGUF layout,
// quant_kregs.cuh), and the repack that writes the split layout.
// quant_matvec.cu routes those matrices here after its argument checks;
// nothing here checks arguments again.
#pragma once

#include <cuda_runtime.h>

#include "activekv/cuda/quant_matvec.h"
#include "matvec_host.h"
#include "matvec_kernel_util.cuh"
#include "quant_dot.cuh"

namespace activekv::cuda::regmv {

/// y = W x for a matrix the register kernel reads (rows > 0), x prequantised
/// in xq: bitwise the chunked kernel's y for the same matrix in the GGUF
/// layout.
void run(const DeviceMatrix& w, const qdot::XQuant& xq, int n_vec, float* y, bool accumulate, cudaStream_t stream);

/// The grouped launch over such matrices of one type, layout and cols (plan
/// from mvhost::plan_group with the chunked kernel's rows per warp).
void run_group(const mvkern::GroupArgs& g, const mvhost::GroupPlan& plan, const DeviceMatrix& w0,
               const qdot::XQuant& xq, int n_vec, cudaStream_t stream);

/// dst (split) from src (GGUF layout), one thread per block.
void repack(const void* src_gguf, const DeviceMatrix& dst, cudaStream_t stream);

}  // namespace activekv::cuda::regmv
