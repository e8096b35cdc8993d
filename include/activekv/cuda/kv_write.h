// Writing the K/V of new tokens into pages, on the GPU.
//
// The model computes K (after RoPE) and V in fp32 on the GPU; they are stored
// as bf16 (round to nearest even, the rule of activekv/core/bf16.h and of
// SequenceKv::write on the CPU) into the page layout of decode_attention.h
// (K planes [n_kv_heads][page_size][head_dim], then V planes). The same
// kernel writes the device copy the step reads and, when given, the host page
// of the one page store through its mapped pinned address -- so the history
// in host memory is complete when the step's work is, with no copy call.
//
// A head shard's shape (AttnShape::sharded(): tensor parallel, one GPU per
// range of KV heads) writes its rows' n_kv_heads heads as heads [kv_head0,
// kv_head0 + n_kv_heads) of pages of page_heads() heads, and nothing else of
// the page: the shards together write every head, each its own bytes.
#pragma once

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

/// Writes tokens i = 0..n-1 into slot `slot0 + i` of one page.
/// k, v: device fp32, token i at k + i * row_stride ([n_kv_heads][head_dim]
/// contiguous per token). device_page: device address (may be null);
/// host_page: pinned mapped host address (may be null); at least one given.
/// Throws InvalidArgument when slot0 + n exceeds the page or no target is given.
void launch_write_kv(const AttnShape& shape, const float* k, const float* v, int64_t row_stride, int n, int slot0,
                     void* device_page, void* host_page, cudaStream_t stream);

/// Where one token's K/V goes: slot `slot` of a page's device copy and/or
/// its host page (mapped pinned), at least one non-null.
struct KvSlot {
  void* device_page = nullptr;
  void* host_page = nullptr;
  int slot = 0;
};

/// Most rows of one launch_write_kv_slots (a decode batch's rows).
inline constexpr int kMaxKvSlots = 8;

/// A decode batch's K/V in one launch: row i (k + i * row_stride, as
/// launch_write_kv) into slots[i], i < n, each its own sequence's page; the
/// bytes written are launch_write_kv's for each row alone. slots: host
/// array, read at the call. Throws InvalidArgument for n outside
/// 1..kMaxKvSlots, a slot outside the page, or a slot with no page.
void launch_write_kv_slots(const AttnShape& shape, const float* k, const float* v, int64_t row_stride,
                           const KvSlot* slots, int n, cudaStream_t stream);

}  // namespace activekv::cuda
