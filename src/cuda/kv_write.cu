// K/V writer. See include/activekv/cuda/kv_write.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "activekv/cuda/kv_write.h"
#include "pdl.cuh"

namespace activekv::cuda {
namespace {

// Where a row's heads go in a page: its heads are the page's [head0, head0 +
// n_kv) of page_heads (a head shard, AttnShape::kv_head0; else 0 and n_kv).
struct PageHeads {
  int head0, page_heads;
};

// Pair r (of n_kv * hd / 2) of one token's K and V, into slot `slot` of a
// page's planes: two bf16 of K and two of V.
__device__ __forceinline__ void write_pair(const float* __restrict__ kr, const float* __restrict__ vr, int r,
                                           int slot, PageHeads ph, int hd, int page_size, __nv_bfloat162* dev,
                                           __nv_bfloat162* host) {
  const int h = (2 * r) / hd, c = (2 * r) % hd;
  const __nv_bfloat162 kb = __floats2bfloat162_rn(kr[2 * r], kr[2 * r + 1]);
  const __nv_bfloat162 vb = __floats2bfloat162_rn(vr[2 * r], vr[2 * r + 1]);
  const int64_t plane = int64_t(page_size) * hd / 2;  // bf16 pairs per plane
  const int64_t ko = int64_t(ph.head0 + h) * plane + (int64_t(slot) * hd + c) / 2;
  const int64_t vo = ko + int64_t(ph.page_heads) * plane;
  if (dev) {
    dev[ko] = kb;
    dev[vo] = vb;
  }
  if (host) {
    host[ko] = kb;
    host[vo] = vb;
  }
}

// One thread per (token, head, channel pair), tokens into consecutive slots of one page.
__global__ void write_kv_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride, int n,
                                int slot0, int n_kv, PageHeads ph, int hd, int page_size, __nv_bfloat162* dev,
                                __nv_bfloat162* host) {
  pdl::begin();
  const int pairs = n_kv * hd / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * pairs) return;
  const int t = int(i / pairs), r = int(i % pairs);
  write_pair(k + int64_t(t) * row_stride, v + int64_t(t) * row_stride, r, slot0 + t, ph, hd, page_size, dev, host);
}

struct KvSlots {
  KvSlot s[kMaxKvSlots];
};

// One thread per (row, head, channel pair), row t into its own slot.
__global__ void write_kv_slots_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t row_stride,
                                      int n, KvSlots slots, int n_kv, PageHeads ph, int hd, int page_size) {
  const int pairs = n_kv * hd / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(n) * pairs) return;
  const int t = int(i / pairs), r = int(i % pairs);
  const KvSlot& to = slots.s[t];
  write_pair(k + int64_t(t) * row_stride, v + int64_t(t) * row_stride, r, to.slot, ph, hd, page_size,
             static_cast<__nv_bfloat162*>(to.device_page), static_cast<__nv_bfloat162*>(to.host_page));
}

constexpr int kBlock = 256;

}  // namespace

namespace {
// The shape's heads must lie in its pages (a head shard's range): else the writes would leave the page.
void check_heads(const AttnShape& sh, const char* who) {
  if (sh.kv_head0 < 0 || sh.n_kv_heads < 1 || sh.kv_head0 + sh.n_kv_heads > sh.page_heads())
    throw InvalidArgument(std::string(who) + ": KV heads [" + std::to_string(sh.kv_head0) + ", " +
                          std::to_string(sh.kv_head0 + sh.n_kv_heads) + ") do not lie in a page of " +
                          std::to_string(sh.page_heads()) + " heads");
}
}  // namespace

void launch_write_kv(const AttnShape& sh, const float* k, const float* v, int64_t row_stride, int n, int slot0,
                     void* device_page, void* host_page, cudaStream_t stream) {
  if (n <= 0) return;
  check_heads(sh, "launch_write_kv");
  if (slot0 < 0 || slot0 + n > sh.page_size)
    throw InvalidArgument("launch_write_kv: slots [" + std::to_string(slot0) + ", " + std::to_string(slot0 + n) +
                          ") outside a page of " + std::to_string(sh.page_size));
  if (!device_page && !host_page) throw InvalidArgument("launch_write_kv: no page to write");
  if (sh.head_dim % 2 != 0) throw InvalidArgument("launch_write_kv: odd head_dim");
  const int64_t threads = int64_t(n) * sh.n_kv_heads * sh.head_dim / 2;
  pdl::launch("write_kv_kernel launch", write_kv_kernel, unsigned((threads + kBlock - 1) / kBlock), kBlock, 0, stream,
              k, v, row_stride, n, slot0, sh.n_kv_heads, PageHeads{sh.kv_head0, sh.page_heads()}, sh.head_dim,
              sh.page_size,
              static_cast<__nv_bfloat162*>(device_page), static_cast<__nv_bfloat162*>(host_page));
}

void launch_write_kv_slots(const AttnShape& sh, const float* k, const float* v, int64_t row_stride,
                           const KvSlot* slots, int n, cudaStream_t stream) {
  if (n < 1 || n > kMaxKvSlots)
    throw InvalidArgument("launch_write_kv_slots: " + std::to_string(n) + " rows, 1.." + std::to_string(kMaxKvSlots) +
                          " allowed");
  if (sh.head_dim % 2 != 0) throw InvalidArgument("launch_write_kv_slots: odd head_dim");
  check_heads(sh, "launch_write_kv_slots");
  KvSlots all{};
  for (int i = 0; i < n; ++i) {
    if (slots[i].slot < 0 || slots[i].slot >= sh.page_size)
      throw InvalidArgument("launch_write_kv_slots: row " + std::to_string(i) + "'s slot " +
                            std::to_string(slots[i].slot) + " outside a page of " + std::to_string(sh.page_size));
    if (!slots[i].device_page && !slots[i].host_page)
      throw InvalidArgument("launch_write_kv_slots: row " + std::to_string(i) + " has no page to write");
    all.s[i] = slots[i];
  }
  const int64_t threads = int64_t(n) * sh.n_kv_heads * sh.head_dim / 2;
  write_kv_slots_kernel<<<unsigned((threads + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      k, v, row_stride, n, all, sh.n_kv_heads, PageHeads{sh.kv_head0, sh.page_heads()}, sh.head_dim, sh.page_size);
  check_cuda(cudaGetLastError(), "write_kv_slots_kernel launch");
}

}  // namespace activekv::cuda
