// Shared by the GPU matvec tests (test_weights.cpp, test_matvec_group.cpp):
// bitwise float comparison and the block-type kernel selection.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "matvec_emulation.h"
#include "matvec_host.h"

namespace activekv::cuda::wtest {

/// Bitwise equality of floats (NaN payloads included), reporting the first mismatch.
template <class T>
::testing::AssertionResult same_bits(const T* got, const T* want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(got + i, want + i, sizeof(T)) != 0) {
      uint32_t g = 0, w = 0;
      std::memcpy(&g, got + i, sizeof(T));
      std::memcpy(&w, want + i, sizeof(T));
      return ::testing::AssertionFailure() << "element " << i << ": got bits 0x" << std::hex << g
                                           << ", want 0x" << w;
    }
  }
  return ::testing::AssertionSuccess();
}

/// Selects a block-type matvec kernel for one scope (the one before, after).
struct KernelScope {
  BlockMatvecKernel before = block_matvec_kernel();
  explicit KernelScope(BlockMatvecKernel k) { set_block_matvec_kernel(k); }
  ~KernelScope() { set_block_matvec_kernel(before); }
};

/// Every block-type kernel (float types have one).
inline std::vector<BlockMatvecKernel> kernels_for(TensorType t) {
  if (is_float_type(t)) return {BlockMatvecKernel::Tiled};
  return {BlockMatvecKernel::Tiled, BlockMatvecKernel::Chunked};
}

/// Selects the register kernel's depth (units in flight) for one scope.
struct SplitDepthScope {
  int before = mvhost::split_depth();
  explicit SplitDepthScope(int d) { mvhost::set_split_depth(d); }
  ~SplitDepthScope() { mvhost::set_split_depth(before); }
};

/// The register kernel's depths a matrix is tested at: both where that
/// kernel reads it (the split layout), else one.
inline std::vector<int> depths_for(WeightLayout l) {
  if (l == WeightLayout::Split) return {1, 2};
  return {1};
}

/// The kernel whose arithmetic a launch with `kernel` selected runs on a
/// matrix of `layout`: split matrices always run the register kernel, and
/// the register kernel's rows are the chunked kernel's bit for bit
/// (register_matvec.cu).
inline BlockMatvecKernel arithmetic_of(BlockMatvecKernel kernel, WeightLayout layout) {
  return layout == WeightLayout::Split ? BlockMatvecKernel::Chunked : kernel;
}

}  // namespace activekv::cuda::wtest
