// K/V writer. See include/activekv/cuda/kv_write.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "activekv/cuda/kv_write.h"

namespace activekv::cuda {
namespace {

// One thread per (token, head, channel pair): two bf16 of K and two of V.
__global__ void write_kv_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride, int n,
                                int slot0, int n_kv, int hd, int page_size, __nv_bfloat162* dev,
                                __nv_bfloat162* host) {
  const int pairs = n_kv * hd / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * pairs) return;
  const int t = int(i / pairs), r = int(i % pairs);
  const int h = (2 * r) / hd, c = (2 * r) % hd;
  const float* kr = k + int64_t(t) * row_stride + 2 * r;
  const float* vr = v + int64_t(t) * row_stride + 2 * r;
  const __nv_bfloat162 kb = __floats2bfloat162_rn(kr[0], kr[1]);
  const __nv_bfloat162 vb = __floats2bfloat162_rn(vr[0], vr[1]);
  const int64_t plane = int64_t(page_size) * hd / 2;  // bf16 pairs per plane
  const int64_t ko = int64_t(h) * plane + (int64_t(slot0 + t) * hd + c) / 2;
  const int64_t vo = ko + int64_t(n_kv) * plane;
  if (dev) {
    dev[ko] = kb;
    dev[vo] = vb;
  }
  if (host) {
    host[ko] = kb;
    host[vo] = vb;
  }
}

}  // namespace

void launch_write_kv(const AttnShape& sh, const float* k, const float* v, int64_t row_stride, int n, int slot0,
                     void* device_page, void* host_page, cudaStream_t stream) {
  if (n <= 0) return;
  if (slot0 < 0 || slot0 + n > sh.page_size)
    throw InvalidArgument("launch_write_kv: slots [" + std::to_string(slot0) + ", " + std::to_string(slot0 + n) +
                          ") outside a page of " + std::to_string(sh.page_size));
  if (!device_page && !host_page) throw InvalidArgument("launch_write_kv: no page to write");
  if (sh.head_dim % 2 != 0) throw InvalidArgument("launch_write_kv: odd head_dim");
  const int64_t threads = int64_t(n) * sh.n_kv_heads * sh.head_dim / 2;
  const int block = 256;
  write_kv_kernel<<<unsigned((threads + block - 1) / block), block, 0, stream>>>(
      k, v, row_stride, n, slot0, sh.n_kv_heads, sh.head_dim, sh.page_size, static_cast<__nv_bfloat162*>(device_page),
      static_cast<__nv_bfloat162*>(host_page));
  check_cuda(cudaGetLastError(), "write_kv_kernel launch");
}

}  // namespace activekv::cuda
