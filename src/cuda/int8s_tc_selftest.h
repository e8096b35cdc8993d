// Internal to the CUDA backend, for tests: one 16-token block through the
// fragment helpers of the tc int8s kernel (int8s_tc_fragments.cuh), one warp,
// so that a fragment-layout mistake fails a focused test
// (tests/cuda/test_int8s_tc.cpp) rather than an attention output.
// Synchronous; CudaError from the GPU, InvalidArgument for a head_dim other
// than 64 or 256 or arrays of the wrong size.
#pragma once

#include <cstdint>
#include <vector>

namespace activekv::cuda::selftest {

/// q.k of one block as the kernel computes it: `q` [16 rows][hd] int8 codes
/// (row g: head g's first query term, row g + 8 its second), `k` [16 tokens][hd]
/// key codes. Returns the int32 dot products [16 rows][16 tokens], read back
/// from the C fragments through the kernel's token mapping (score_token).
std::vector<int32_t> int8s_tc_qk_block(int hd, const std::vector<int8_t>& q, const std::vector<int8_t>& k);

/// P.V of one block as the kernel computes it: `p` [8 heads][16 tokens]
/// weights in [0, 1] (split into f16 hi + lo terms of p * 2^12), `v`
/// [16 tokens][hd] value codes. Returns sum_t p[g][t] v[t][c] as [8][hd] fp32,
/// read back through the kernel's channel mapping (pv_channel), hi + lo rows
/// added and 2^-12 taken off as in the kernel's epilogue. channel_rows: the
/// transposed form (pv_block_t, Int8sTcConfig::channel_rows), read back
/// through pvt_channel / pvt_head.
std::vector<float> int8s_tc_pv_block(int hd, const std::vector<float>& p, const std::vector<int8_t>& v,
                                     bool channel_rows = false);

}  // namespace activekv::cuda::selftest
