// One block through the tc int8s kernel's fragment helpers: see int8s_tc_selftest.h.
#include "int8s_tc_selftest.h"

#include <cuda_runtime.h>

#include <string>

#include "activekv/cuda/decode_attention.h"
#include "device_buffer.h"
#include "int8s_tc_fragments.cuh"

namespace activekv::cuda::selftest {
namespace {

using namespace detail;

// Stage of 16 rows of HD codes in the kernel's swizzled layout (plain stores; the kernel uses cp.async).
template <int HD>
__device__ void fill_stage(unsigned char* stage, const int8_t* rows, int lane) {
  for (int idx = lane; idx < kTcBlk * HD; idx += 32) {
    const int r = idx / HD, j = idx % HD;
    stage[stage_offset<HD>(r, j / 16) + j % 16] = uint8_t(rows[idx]);
  }
}

template <int HD>
__global__ void qk_kernel(const int8_t* q, const int8_t* k, int32_t* out) {
  __shared__ __align__(128) unsigned char stage[kTcBlk * HD];
  __shared__ __align__(16) unsigned char sq[HD * 16];
  const int lane = threadIdx.x, g = lane >> 2, q4 = lane & 3;
  fill_stage<HD>(stage, k, lane);
  for (int idx = lane; idx < 16 * HD; idx += 32) sq[q_frag_byte(idx / HD, idx % HD)] = uint8_t(q[idx]);
  __syncwarp();
  uint4 qa[HD / 32];
  load_q_frags<HD>(reinterpret_cast<const uint4*>(sq), lane, qa);
  int c[2][4];
  qk_block<HD>(qa, smem_u32(stage), lane, c);
  for (int nt = 0; nt < 2; ++nt)
    for (int j = 0; j < 2; ++j) {
      out[g * 16 + score_token(nt, q4, j)] = c[nt][j];
      out[(g + 8) * 16 + score_token(nt, q4, j)] = c[nt][2 + j];
    }
}

template <int HD, bool CR>
__global__ void pv_kernel(const float* p, const int8_t* v, float* out) {
  __shared__ __align__(128) unsigned char stage[kTcBlk * HD];
  const int lane = threadIdx.x, g = lane >> 2, q4 = lane & 3;
  fill_stage<HD>(stage, v, lane);
  __syncwarp();
  float pw[2][2];
  for (int nt = 0; nt < 2; ++nt)
    for (int j = 0; j < 2; ++j) pw[nt][j] = p[g * 16 + score_token(nt, q4, j)];
  uint32_t a[4];
  p_frag(pw, a);
  if constexpr (CR) {  // channel rows: hi and lo terms in one accumulator
    float acc[HD / 16][1][4] = {};
    pv_block_t<HD>(smem_u32(stage), a, lane, acc);
    for (int c = 0; c < HD / 16; ++c)
      for (int i = 0; i < 4; ++i) out[pvt_head(i, q4) * HD + pvt_channel(c, i, g)] = acc[c][0][i] * kPUnscale;
  } else {
    float acc[HD / 16][2][4] = {};
    pv_block<HD>(smem_u32(stage), a, lane, acc);
    for (int c = 0; c < HD / 16; ++c)
      for (int e = 0; e < 2; ++e)
        for (int i = 0; i < 2; ++i)
          out[g * HD + pv_channel(c, e, i, q4)] = (acc[c][e][i] + acc[c][e][i + 2]) * kPUnscale;
  }
}

void check(int hd, size_t got, size_t want, const char* what) {
  if (hd != 64 && hd != 256) throw InvalidArgument("int8s tc selftest: head_dim must be 64 or 256, got " + std::to_string(hd));
  if (got != want)
    throw InvalidArgument(std::string("int8s tc selftest: ") + what + " has " + std::to_string(got) + " values, want " +
                          std::to_string(want));
}

}  // namespace

std::vector<int32_t> int8s_tc_qk_block(int hd, const std::vector<int8_t>& q, const std::vector<int8_t>& k) {
  check(hd, q.size(), size_t(16) * hd, "q");
  check(hd, k.size(), size_t(16) * hd, "k");
  DevBuf dq(q.size()), dk(k.size()), dout(256 * 4);
  check_cuda(cudaMemcpy(dq.p, q.data(), q.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(dk.p, k.data(), k.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  if (hd == 256) qk_kernel<256><<<1, 32>>>(dq.as<int8_t>(), dk.as<int8_t>(), dout.as<int32_t>());
  else qk_kernel<64><<<1, 32>>>(dq.as<int8_t>(), dk.as<int8_t>(), dout.as<int32_t>());
  check_cuda(cudaGetLastError(), "int8s tc selftest qk launch");
  std::vector<int32_t> out(256);
  check_cuda(cudaMemcpy(out.data(), dout.p, 256 * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

std::vector<float> int8s_tc_pv_block(int hd, const std::vector<float>& p, const std::vector<int8_t>& v,
                                     bool channel_rows) {
  check(hd, p.size(), size_t(8) * 16, "p");
  check(hd, v.size(), size_t(16) * hd, "v");
  DevBuf dp(p.size() * 4), dv(v.size()), dout(size_t(8) * hd * 4);
  check_cuda(cudaMemcpy(dp.p, p.data(), p.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(dv.p, v.data(), v.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  const float* pp = dp.as<float>();
  const int8_t* pv = dv.as<int8_t>();
  float* po = dout.as<float>();
  if (hd == 256) channel_rows ? pv_kernel<256, true><<<1, 32>>>(pp, pv, po) : pv_kernel<256, false><<<1, 32>>>(pp, pv, po);
  else channel_rows ? pv_kernel<64, true><<<1, 32>>>(pp, pv, po) : pv_kernel<64, false><<<1, 32>>>(pp, pv, po);
  check_cuda(cudaGetLastError(), "int8s tc selftest pv launch");
  std::vector<float> out(size_t(8) * hd);
  check_cuda(cudaMemcpy(out.data(), dout.p, out.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return out;
}

}  // namespace activekv::cuda::selftest
