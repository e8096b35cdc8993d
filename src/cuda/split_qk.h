// Internal to the CUDA backend (and its tests): the split kernel's launch
// forms (decode_attention.cu), chosen per process by two switches until an
// A/B on the GPU picks one of each:
//   ACTIVEKV_SPLIT_QK=packed: the query's hi and mid bf16 terms in rows 0..7
//       and 8..15 of one mma, lo in a second (4 mma per 16 channels x 16
//       tokens); default "terms": one mma per term, rows 8..15 zero (6 mma).
//       Same bits (CudaDecode.SplitFormsAgree); passed every GPU decode test
//       on an H100 (58b2b6f); speed not yet measured.
//   ACTIVEKV_SPLIT_WARPS=3 (head_dim 256 only): 3 warps x 2 ring stages per
//       CTA instead of 2 x 3 -- the same shared memory, 6 warps per SM
//       instead of 4. Other bits (W sets which warp sums which blocks):
//       tested against the default within fp32 tolerance. Not yet run.
// To time them in one build on the GPU machine:
//   AKV_ENV_A=ACTIVEKV_SPLIT_QK=terms AKV_ENV_B=ACTIVEKV_SPLIT_QK=packed scripts/device_run.sh env-ab
// then keep the faster form and delete the other (and its switch).
#pragma once

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda::detail {

/// A launch form of the split kernel (the defaults: launch_split_attention's
/// without the environment switches).
struct SplitForm {
  bool packed_qk = false;  ///< Q.K^T with hi and mid terms packed in one mma
  bool wide = false;       ///< head_dim 256: 3 warps x 2 stages (else 2 x 3)
};

/// launch_split_attention with the form given; same arguments and errors.
void launch_split_attention_form(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                                 Partials partials, cudaStream_t stream, SplitForm form);

}  // namespace activekv::cuda::detail
