// Internal to the CUDA backend (and its tests): the split kernel's two forms
// of Q.K^T (decode_attention.cu), which give the same bits.
//   packed: the query's hi and mid bf16 terms in rows 0..7 and 8..15 of one
//           mma, lo in a second (4 mma per 16 channels x 16 tokens);
//   terms:  one mma per term, rows 8..15 zero (6 mma).
// launch_split_attention takes packed unless ACTIVEKV_SPLIT_QK=terms (A/B
// runs of the two in one build: scripts/device_run.sh qk-ab).
#pragma once

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda::detail {

/// launch_split_attention with the Q.K^T form chosen; same arguments and errors.
void launch_split_attention_qk(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                               Partials partials, cudaStream_t stream, bool packed_qk);

}  // namespace activekv::cuda::detail
