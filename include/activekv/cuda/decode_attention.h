// Paged BF16 decode attention on the GPU (exact tier) and the partial merge.
//
// Page layout (identical to the host layout of activekv/kv/page_store.h), bf16:
//
//   K planes: [n_kv_heads][page_size][head_dim]
//   V planes: [n_kv_heads][page_size][head_dim]   (right after the K planes)
//
// (n_kv_heads of the page: AttnShape::page_heads(); a head shard attends
// heads kv_head0.. of it, see AttnShape.)
//
// The kernel works on *splits*: a span of `ntok` consecutive tokens inside one
// page (split boundaries are fixed token positions, multiples of the split
// size, so resident, whole-layer-staged and tile-streamed runs cut the history
// at the same places and give the same bits). One CTA handles one split of one
// KV head for all `group` query heads of that head (GQA: each K/V element is
// read once from memory for the whole group), and writes one *partial*
// (SPEC §4): the normalised output O (fp32) and LSE (fp32, natural log) per
// query head. The merge kernel combines the partials of each sequence in
// ascending split order, skipping partials whose LSE is -inf.
//
// Query head i uses KV head i / group (the llama.cpp / HF GQA convention).
// Scores are s_t = (q . k_t) * softmax_scale; all arithmetic is fp32.
//
// Everything here is asynchronous on the given stream; errors in arguments
// throw activekv::InvalidArgument, CUDA errors throw activekv::cuda::CudaError.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "activekv/core/error.h"

typedef struct CUstream_st* cudaStream_t;

namespace activekv::cuda {

/// A failed CUDA runtime call; the message names the call and the CUDA error.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& what) : Error(what) {}
};

/// Throws CudaError("<what>: <cuda error string>") if `status` != cudaSuccess.
void check_cuda(int status, const char* what);

/// Why this machine has no usable CUDA GPU, in one phrase ("no NVIDIA GPU
/// found (cudaGetDeviceCount: cudaErrorNoDevice)"); "" when it has one.
/// `--device auto` prints it when it falls back to the CPU.
std::string gpu_absence_reason();

/// Selects GPU `device`. Throws CudaError("<who>: no usable CUDA GPU on this
/// machine (...)") when there is none -- the runtime's own words for that are
/// "CUDA driver version is insufficient" -- and InvalidArgument for a device
/// index that does not exist. Call it before any long CPU work that ends on the GPU.
void require_gpu(int device, const std::string& who);

/// The split size the GPU paths use unless told otherwise: the largest
/// divisor of `page_size` that is <= 512 tokens (512 for pages of 512 or
/// more that are multiples of it). Throws InvalidArgument if page_size <= 0.
int default_split_tokens(int page_size);

/// Shape of one layer's attention.
struct AttnShape {
  int n_kv_heads = 0;
  int group = 0;        ///< query heads per KV head (n_q_heads = n_kv_heads * group), 1..8
  int head_dim = 0;     ///< 64, 128 or 256 (the instantiated kernels)
  int page_size = 1024; ///< tokens per page
  int split_tokens = 512;  ///< tokens per CTA; divides page_size
  float softmax_scale = 0.f;  ///< 0 = 1/sqrt(head_dim)
  /// Head shards (several GPUs, issue 15): the kernels attend KV heads
  /// [kv_head0, kv_head0 + n_kv_heads) of pages laid out with page_kv_heads
  /// heads (the model's; 0 = n_kv_heads, i.e. no shard). Queries, partials
  /// and outputs hold only the attended heads ([..][n_q_heads()][head_dim],
  /// query head i of the shard follows KV head kv_head0 + i / group), so
  /// each head's arithmetic is the same whatever the shard: bitwise equal.
  int kv_head0 = 0;
  int page_kv_heads = 0;

  int n_q_heads() const { return n_kv_heads * group; }
  /// KV heads a page holds (page_kv_heads, or n_kv_heads when 0).
  int page_heads() const { return page_kv_heads > 0 ? page_kv_heads : n_kv_heads; }
  /// Whether this shape attends only part of the pages' heads.
  bool sharded() const { return page_heads() != n_kv_heads; }
  /// Bytes of one bf16 page as stored (K and V planes of every KV head of
  /// the page layout, page_heads() of them).
  size_t page_bytes() const { return size_t(2) * page_heads() * page_size * head_dim * 2; }
  /// Bytes of one K or V plane (one KV head of one page, bf16).
  size_t plane_bytes() const { return size_t(page_size) * head_dim * 2; }
  /// Throws InvalidArgument naming the field if the shape is not supported.
  void validate() const;
};

/// One unit of kernel work: `ntok` tokens starting at token `tok0` of the page
/// at device address `page`, for sequence `seq`; the partial goes to split slot
/// `split` of that sequence. (16 bytes + pointer, device-resident arrays.)
struct SplitWork {
  const void* page = nullptr;  ///< device pointer to the page (bf16, layout above)
  int32_t seq = 0;
  int32_t tok0 = 0;
  int32_t ntok = 0;  ///< at most the shape's split_tokens (the int8s kernels size shared memory by it)
  int32_t split = 0;
};

/// Partial buffers of a batch: O [n_seq][max_splits][n_q_heads][head_dim] fp32,
/// LSE [n_seq][max_splits][n_q_heads] fp32 (device memory).
struct Partials {
  float* o = nullptr;
  float* lse = nullptr;
  int max_splits = 0;
};

/// Runs attention for `n_work` splits (device array `work`) with queries
/// `q` [n_seq][n_q_heads][head_dim] fp32 (device), writing partials.
/// Grid: n_work x n_kv_heads CTAs (64 threads for head_dim 256, 128 for 64 and 128);
/// CTA (w, h) reads page head kv_head0 + h and query heads h*group.. of q.
/// n_work == 0 is a no-op.
void launch_split_attention(const AttnShape& shape, const SplitWork* work, int n_work,
                            const float* q, Partials partials, cudaStream_t stream);

/// Most splits per sequence launch_merge takes (its weights live in shared memory).
inline constexpr int kMaxMergeSplits = 12288;

/// Rows of fp32 activations as the int8 blocks a block-type matvec reads
/// (quant_matvec.h: launch_matvec_prequantized's workspace, whose layout
/// matvec_int8_blocks gives): codes [n_rows][cols] int8 and, per 32-element
/// block, {d, sum of its codes} [n_rows][cols / 32] as float pairs. `codes`
/// null: none wanted.
struct Int8Blocks {
  int8_t* codes = nullptr;
  float* scales = nullptr;  ///< float pairs {d, sum}, one per 32 codes

  /// The blocks of row `row` on, for rows of `cols` elements (a multiple of 32).
  Int8Blocks from_row(int row, int64_t cols) const {
    if (!codes) return {};
    return {codes + int64_t(row) * cols, scales + 2 * (int64_t(row) * cols / 32)};
  }
};

/// Merges, for each of `n_seq` sequences, its first n_splits[s] partials
/// (device int array) in ascending order: out [n_seq][n_q_heads][head_dim] fp32,
/// out_lse [n_seq][n_q_heads] fp32 (may be null). A sequence whose partials are
/// all empty (LSE -inf) gets O = 0 and LSE = -inf. With out_int8.codes set,
/// the same kernel also writes out as int8 blocks (rows of n_q_heads x
/// head_dim), bitwise what launch_quantize_activations writes for out: the
/// output projection then needs no quantising launch of its own.
void launch_merge(const AttnShape& shape, Partials partials, const int32_t* n_splits,
                  int n_seq, float* out, float* out_lse, cudaStream_t stream, Int8Blocks out_int8 = {});

}  // namespace activekv::cuda
