// The model's exact attention on the GPU (`activekv generate --device cuda`).
//
// CudaAttentionBackend implements attention::AttentionBackend with the paged
// BF16 flash-style prefill kernel (prefill.h), fp32-accurate (3 bf16 terms): a
// block of query rows at consecutive positions is one PrefillAttention::run
// (one row = a decode step; it is not bitwise the decode engine's split
// kernel, which is a different kernel, but agrees to fp32 rounding). Model
// layers stay on the CPU.
//
// History: pages are *mirrored* in GPU memory as they are written. Each host
// PageId gets one device page (allocated on first use, same layout, bf16);
// per layer the backend remembers how many tokens of which page table are
// already on the GPU and, before each attention, copies only the tokens
// written since (one cudaMemcpy2D per touched page: the token range of every
// K and V plane). A decode step therefore moves n_layers x one token of K/V.
// If the page table or the positions move backwards (truncate, clear, another
// sequence) the mirror is refreshed from the first changed page.
//
// Only bf16 pages; head_dim 64, 128 or 256; query heads per KV head 1..8 (the
// instantiated kernels). Not thread-safe. Needs a CUDA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "activekv/attention/backend.h"
#include "activekv/cuda/decode_attention.h"
#include "activekv/kv/page_store.h"

namespace activekv::cuda {

class PrefillAttention;

class CudaAttentionBackend final : public attention::AttentionBackend {
 public:
  /// `shape`: the model's KV shape (format must be bf16); `n_heads`: query
  /// heads. split_tokens: the AttnShape's split (0 = the largest divisor of
  /// the page size that is <= 512); the prefill kernel picks its own key
  /// splits, so it only has to divide the page size. Throws InvalidArgument
  /// for an unsupported shape, CudaError if no device can be used.
  CudaAttentionBackend(const kv::KvShape& shape, int n_heads, int split_tokens = 0, int device = 0);
  ~CudaAttentionBackend() override;
  CudaAttentionBackend(const CudaAttentionBackend&) = delete;
  CudaAttentionBackend& operator=(const CudaAttentionBackend&) = delete;

  attention::Partial attend(int layer, const attention::LayerHistory& history, const attention::QueryRows& q,
                            const attention::AttentionOptions& opt) override;

  const AttnShape& attn_shape() const { return attn_; }
  /// Host -> device K/V bytes copied so far (mirroring).
  size_t bytes_uploaded() const { return bytes_uploaded_; }
  /// Device pages allocated (one per host page id seen).
  size_t device_pages() const { return n_dev_pages_; }
  /// Device name, e.g. "NVIDIA H200".
  const std::string& device_name() const { return device_name_; }

 private:
  void mirror(int layer, const attention::LayerHistory& h, int64_t first_row_pos);
  void* device_page(kv::PageId id);

  kv::KvShape shape_;
  AttnShape attn_;
  std::string device_name_;
  std::unique_ptr<PrefillAttention> prefill_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> dev_pages_;                     // [host page id] -> device page (or null)
  size_t n_dev_pages_ = 0;
  std::vector<int64_t> mirrored_;                    // [layer] tokens on the device
  std::vector<std::vector<kv::PageId>> tables_;      // [layer] page table those tokens came from
  float* q_dev_ = nullptr;
  float* o_dev_ = nullptr;
  float* lse_dev_ = nullptr;
  size_t cap_rows_ = 0;
  std::vector<const void*> table_host_;              // device page pointers of the layer being attended
  const void** table_dev_ = nullptr;                 // ... on the device
  size_t cap_table_ = 0;
  size_t bytes_uploaded_ = 0;
};

}  // namespace activekv::cuda
