// Internal to the decode engine's CPU share (cpu_share.h): the kernel that
// moves the CPU's partials from mapped pinned staging into the engine's
// partial slots. Kept apart from cpu_share.h so that the .cu file needs
// only the partial layout (decode_attention.h).
#pragma once

#include <cstdint>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

/// Consecutive partial rows (one split of all query heads each) to move:
/// staging rows [src_row, src_row + read) to partial slots [dst_row, ...);
/// slots [dst_row + read, dst_row + count) are marked empty (LSE = -inf, O
/// not written: the merge never reads an empty partial's O). read < count
/// where the CPU merged a run's splits into its first row.
struct PartialRun {
  int64_t dst_row = 0, src_row = 0;
  int32_t count = 0, read = 0;
};
/// Runs of one launch, passed by value (kernel parameters: no upload).
struct PartialRuns {
  static constexpr int kMax = 32;
  PartialRun run[kMax];
  int n = 0;
};
/// Enqueues on `stream` a kernel that moves `runs` from mapped pinned
/// staging (device-visible pointers src_o [rows][row_floats], src_lse
/// [rows][nq]) into `parts` (O [slots][row_floats], LSE [slots][nq]).
/// row_floats (n_q_heads * head_dim) must be a multiple of 4.
void launch_gather_partials(const PartialRuns& runs, const float* src_o, const float* src_lse, Partials parts,
                            int row_floats, int nq, cudaStream_t stream);

}  // namespace activekv::cuda
