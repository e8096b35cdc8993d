// lossless13 -> bf16 unpacking on the GPU (SPEC §3.2). Contract:
// include/activekv/cuda/format_kernels.h; blob layout:
// include/activekv/kv/codec_lossless13.h. CPU reference: kv::decode_lossless13_page.
//
// 8 values take 8 x 13 = 104 bits = 13 bytes, and every plane's codes start on
// a byte, so a thread decodes 8 values from 13 consecutive bytes and writes
// them as one 16-byte store. The 13 bytes are gathered with byte loads (a
// plane starts after a table of n_exp bytes, so nothing larger is aligned).
#include <cuda_runtime.h>

#include <string>

#include "activekv/cuda/format_kernels.h"

namespace activekv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeaderBytes = 64;
constexpr uint16_t kNaN = 0x7fc0;

__global__ void __launch_bounds__(kThreads)
unpack_lossless13_kernel(const UnpackWork* __restrict__ items, int n_kv, int head_dim, int page_size, int head0,
                         int page_heads) {
  __shared__ uint16_t table[32];
  __shared__ int plane_state;  // 0 table, 1 raw, 2 invalid
  __shared__ uint32_t plane_off;
  const UnpackWork it = items[blockIdx.x];
  // Plane of the blob: K of heads head0..head0+n_kv-1, then their V (a head
  // shard unpacks only its heads), written where the bf16 page holds it.
  const int p = blockIdx.y < n_kv ? head0 + int(blockIdx.y) : page_heads + head0 + int(blockIdx.y) - n_kv;
  const unsigned char* blob = static_cast<const unsigned char*>(it.src);
  const unsigned char* payload = blob + kHeaderBytes;
  const uint32_t n_tokens = *reinterpret_cast<const uint32_t*>(blob + 20);
  const uint64_t payload_bytes = it.src_bytes > kHeaderBytes ? it.src_bytes - kHeaderBytes : 0;
  const uint64_t n = uint64_t(n_tokens <= uint32_t(page_size) ? n_tokens : 0) * uint64_t(head_dim);
  uint16_t* dst = static_cast<uint16_t*>(it.dst) + size_t(p) * page_size * head_dim;

  if (threadIdx.x == 0) {
    int state = 2;
    uint32_t off = 0;
    const uint64_t dir_bytes = 8ull * page_heads;
    if (payload_bytes >= dir_bytes && n_tokens > 0 && n_tokens <= uint32_t(page_size)) {
      off = *reinterpret_cast<const uint32_t*>(payload + 4 * size_t(p));  // directory is 4-byte aligned
      if (uint64_t(off) + 2 <= payload_bytes) {
        const unsigned mode = payload[off], n_exp = payload[off + 1];
        if (mode == 1 && n_exp == 0 && uint64_t(off) + 2 + 2 * n <= payload_bytes) state = 1;
        if (mode == 0 && n_exp >= 1 && n_exp <= 32 && uint64_t(off) + 2 + n_exp + (13 * n + 7) / 8 <= payload_bytes) {
          state = 0;
          for (unsigned i = 0; i < n_exp; ++i) table[i] = uint16_t(payload[off + 2 + i]) << 7;
          for (unsigned i = n_exp; i < 32; ++i) table[i] = kNaN;  // an index past the table reads as NaN
        }
      }
    }
    plane_state = state;
    plane_off = off;
  }
  __syncthreads();
  const int state = plane_state;
  const unsigned char* data = payload + plane_off;
  if (state == 2) {
    for (uint64_t i = threadIdx.x; i < uint64_t(page_size) * head_dim; i += kThreads) dst[i] = kNaN;
    return;
  }
  if (state == 1) {  // raw plane: little-endian bf16 values at an arbitrary byte offset
    const unsigned char* raw = data + 2;
    for (uint64_t i = threadIdx.x; i < n; i += kThreads) dst[i] = uint16_t(raw[2 * i]) | uint16_t(raw[2 * i + 1]) << 8;
    return;
  }
  const unsigned char* codes = data + 2 + data[1];
  const uint64_t n_groups = n / 8;  // head_dim is a multiple of 8: whole groups only
  for (uint64_t gi = threadIdx.x; gi < n_groups; gi += kThreads) {
    const unsigned char* b = codes + 13 * gi;
    uint64_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) lo |= uint64_t(b[i]) << (8 * i);
#pragma unroll
    for (int i = 0; i < 5; ++i) hi |= uint64_t(b[8 + i]) << (8 * i);
    uint32_t out[4];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int bit = 13 * k;
      const uint32_t code =
          uint32_t((bit + 13 <= 64 ? lo >> bit : (bit >= 64 ? hi >> (bit - 64) : (lo >> bit) | (hi << (64 - bit)))) &
                   0x1fffu);
      const uint16_t v = uint16_t((code >> 12) << 15) | table[(code >> 7) & 0x1fu] | uint16_t(code & 0x7fu);
      if (k % 2 == 0) out[k / 2] = v;
      else out[k / 2] |= uint32_t(v) << 16;
    }
    *reinterpret_cast<uint4*>(dst + 8 * gi) = make_uint4(out[0], out[1], out[2], out[3]);
  }
}

}  // namespace

void launch_unpack_lossless13(const AttnShape& shape, const UnpackWork* items, int n_items, cudaStream_t stream) {
  shape.validate();
  if (n_items < 0) throw InvalidArgument("launch_unpack_lossless13: n_items < 0");
  if (n_items == 0) return;
  unpack_lossless13_kernel<<<dim3(n_items, 2 * shape.n_kv_heads), kThreads, 0, stream>>>(
      items, shape.n_kv_heads, shape.head_dim, shape.page_size, shape.kv_head0, shape.page_heads());
  check_cuda(cudaGetLastError(), "unpack_lossless13_kernel launch");
}

}  // namespace activekv::cuda
