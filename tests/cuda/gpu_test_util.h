// Shared by the GPU tests (tests/cuda, label `gpu`): skipping without a GPU,
// checked CUDA calls, random bf16 pages and their fp64 reference attention.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "activekv/attention/quality.h"
#include "activekv/core/bf16.h"
#include "activekv/kv/page_store.h"

namespace activekv::testing {

inline int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace activekv::testing

/// First line of a test that needs a GPU: skips it (not a pass) without one.
#define NEED_GPU() \
  if (::activekv::testing::gpu_count() == 0) GTEST_SKIP() << "no CUDA device"

/// Asserts that a CUDA runtime call succeeded, naming the call and the error.
#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    const cudaError_t akv_e_ = (call);                                                  \
    ASSERT_EQ(cudaSuccess, akv_e_) << #call << ": " << cudaGetErrorString(akv_e_);     \
  } while (0)

namespace activekv::testing {

/// `bytes` of uniform random bf16 values in [-1, 1) from `seed` (host memory).
inline void fill_random_bf16(std::byte* data, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  bf16* p = reinterpret_cast<bf16*>(data);
  for (size_t i = 0; i < bytes / sizeof(bf16); ++i) p[i] = f32_to_bf16(u(rng));
}

/// The first `n_tokens` tokens of bf16 pages of `shape`'s layout (`pages[i]`:
/// page i in host memory) as an fp64 history, for attention::reference_attention.
inline attention::DenseHistoryF64 dense_history(const kv::KvShape& shape, const std::vector<const std::byte*>& pages,
                                                int64_t n_tokens) {
  attention::DenseHistoryF64 h;
  for (size_t i = 0; int64_t(i) * shape.page_size < n_tokens; ++i) {
    const int n = int(std::min<int64_t>(shape.page_size, n_tokens - int64_t(i) * shape.page_size));
    h.append(shape, std::span(reinterpret_cast<const bf16*>(pages.at(i)), shape.page_elements()), n);
  }
  return h;
}

}  // namespace activekv::testing
