// Attention partials and the exact log-sum-exp merge (SPEC §4).
//
// A partial is the attention of a block of query rows over one subset of the
// keys (one tile, one format): the normalised output O and the log-sum-exp
// LSE of the scaled scores, per query row and query head.
//
//   O   [n_rows][n_heads][head_dim]  fp32, normalised (sum_t softmax(s)_t V_t)
//   LSE [n_rows][n_heads]            fp32, natural log; -inf marks an *empty*
//                                    row (no key visible), whose O is never read
//
// Merge (SPEC §4): M = max_a L_a; w_a = exp(L_a - M);
//   O = sum_a w_a O_a / sum_a w_a;  L = M + log sum_a w_a.
// This equals softmax attention over the union of the keys, up to fp32
// summation order. Partials merge in the order given (ascending tiles).
// Same formulation as FlashInfer's merge_state (include/flashinfer/attention/cascade.cuh).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace activekv::attention {

/// (O, LSE) for a block of query rows. See the file comment for layouts.
struct Partial {
  int n_rows = 0;
  int n_heads = 0;
  int head_dim = 0;
  std::vector<float> o;    ///< [n_rows][n_heads][head_dim]
  std::vector<float> lse;  ///< [n_rows][n_heads]

  Partial() = default;
  /// An all-empty partial: LSE = -inf everywhere, O = 0.
  Partial(int rows, int heads, int dim);

  float* o_at(int row, int head) { return o.data() + (size_t(row) * n_heads + head) * head_dim; }
  const float* o_at(int row, int head) const {
    return o.data() + (size_t(row) * n_heads + head) * head_dim;
  }
  float& lse_at(int row, int head) { return lse[size_t(row) * n_heads + head]; }
  float lse_at(int row, int head) const { return lse[size_t(row) * n_heads + head]; }
};

/// Merges one (row, head) across `n` partial states: out_o[head_dim], returns L.
/// States with L = -inf are skipped and their O is never read (it may be NaN).
/// If every state is empty, out_o is zero-filled and -inf is returned.
float merge_states(std::span<const float* const> o, std::span<const float> lse, int head_dim,
                   float* out_o);

/// Merges partials of the same shape, in the order given. Throws
/// InvalidArgument if the list is empty or the shapes differ.
Partial merge(std::span<const Partial> parts);

}  // namespace activekv::attention
