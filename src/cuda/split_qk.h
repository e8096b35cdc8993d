// Internal to the CUDA backend (and its tests): the split kernel's two forms
// of Q.K^T (decode_attention.cu), which give the same bits.
//   packed: the query's hi and mid bf16 terms in rows 0..7 and 8..15 of one
//           mma, lo in a second (4 mma per 16 channels x 16 tokens);
//   terms:  one mma per term, rows 8..15 zero (6 mma).
// launch_split_attention takes terms unless ACTIVEKV_SPLIT_QK=packed: packed
// passed every GPU decode test on an H100 (58b2b6f, bitwise equal to terms),
// its speed is not yet measured. To time the two in one build:
//   AKV_ENV_A=ACTIVEKV_SPLIT_QK=terms AKV_ENV_B=ACTIVEKV_SPLIT_QK=packed scripts/device_run.sh env-ab
// then keep the faster form and delete the other (and this switch).
#pragma once

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda::detail {

/// launch_split_attention with the Q.K^T form chosen; same arguments and errors.
void launch_split_attention_qk(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                               Partials partials, cudaStream_t stream, bool packed_qk);

}  // namespace activekv::cuda::detail
