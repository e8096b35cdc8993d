// Internal to the CUDA backend: the tensor-core int8s kernel
// (int8s_tc_attention.cu), which launch_split_attention_int8s
// (int8s_attention.cu) runs for Int8sKernel::tc after checking the shape
// and options it shares with the legacy kernel.
#pragma once

#include <string>

#include "activekv/cuda/format_kernels.h"

namespace activekv::cuda {

/// Whether the tc kernel is instantiated for `group` query heads per KV head (3, 4, 6, 7, 8).
bool int8s_tc_supports_group(int group);
/// The longest split the tc kernel takes: a split's token scales are held in
/// shared memory. The engine refuses a longer split_tokens with an explicit tc
/// kernel at construction, not at its first int8s page.
inline constexpr int kMaxTcSplit = 4096;

/// The one-line error for a group the tc kernel is not instantiated for.
std::string tc_group_error(int group);

/// launch_split_attention_int8s with the tc kernel; the shape is already
/// validated (head_dim 64 or 256, page_size a multiple of 16, query_terms 1
/// or 2). scale_log2 = softmax scale * log2 e. Throws InvalidArgument for a
/// group it is not instantiated for or split_tokens > 4096.
void launch_split_attention_int8s_tc(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                                     Partials partials, const Int8sKernelOptions& opt, float scale_log2,
                                     cudaStream_t stream);

}  // namespace activekv::cuda
