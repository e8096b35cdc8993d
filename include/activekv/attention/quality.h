// fp64 reference attention and the own-format error of SPEC §5.
//
// O_ref of SPEC §5 is fp64 attention with the *unquantised* query over the
// history each format actually stores: exact bf16 values for bf16/lossless13
// pages, the dequantised values (c_j * s_t * q, v_j * q from the stored fp16
// scales, exact in double) for int8s pages. Build that history with
// DenseHistoryF64 (append pages in token order, mixing formats as a hybrid
// route does), then call reference_attention.
//
// own-format error = max over rows and heads of |O_kernel - O_ref|_inf / |O_ref|_inf.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "activekv/attention/paged_attention.h"
#include "activekv/attention/partial.h"
#include "activekv/kv/codec.h"

namespace activekv::attention {

/// A history of one layer in double: k, v [n_tokens][n_kv_heads][head_dim],
/// token i at absolute position first_token + i.
struct DenseHistoryF64 {
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t first_token = 0;
  int64_t n_tokens = 0;
  std::vector<double> k, v;

  /// Appends the first `n_tokens` tokens of an encoded page (validated; throws
  /// Error if it does not; InvalidArgument if its dimensions differ from the
  /// history's or it holds fewer tokens).
  void append(std::span<const std::byte> blob, int n_tokens);
  void append(const kv::EncodedPage& page, int n_tokens) { append(std::span<const std::byte>(page.bytes), n_tokens); }
  /// Appends the first `n_tokens` tokens of page `id` of a store (bf16 or f32).
  void append(const kv::PageStore& store, kv::PageId id, int n_tokens);
  /// Appends the first `n_tokens` tokens of a bf16 page in the PageStore
  /// layout (`page`: shape.page_elements() values, K planes then V planes,
  /// e.g. a page the GPU engine reads). Throws InvalidArgument if the page's
  /// size or dimensions differ from the shape's or the history's, or
  /// n_tokens is outside [0, page_size].
  void append(const kv::KvShape& shape, std::span<const bf16> page, int n_tokens);
  double k_at(int64_t t, int g, int j) const { return k[(size_t(t) * n_kv_heads + g) * head_dim + j]; }
  double v_at(int64_t t, int g, int j) const { return v[(size_t(t) * n_kv_heads + g) * head_dim + j]; }
};

/// The dequantised history of a tile of encoded pages, with the same page /
/// token conventions as attend_int8s_tile (tokens [first_token, min(first_token
/// + pages * page_size, history_tokens))).
DenseHistoryF64 dequantize_history(std::span<const kv::EncodedPage* const> pages, int64_t first_token,
                                   int64_t history_tokens);

/// fp64 attention results: o [n_rows][n_heads][head_dim], lse [n_rows][n_heads]
/// (-inf: no visible key).
struct ReferencePartial {
  int n_rows = 0, n_heads = 0, head_dim = 0;
  std::vector<double> o, lse;
  const double* o_at(int r, int h) const { return o.data() + (size_t(r) * n_heads + h) * head_dim; }
  double lse_at(int r, int h) const { return lse[size_t(r) * n_heads + h]; }
};

/// Causal fp64 softmax attention of the (unquantised, fp32) query rows over
/// `h`, scores (q . k) * scale with scale = opt.softmax_scale or 1/sqrt(d);
/// with opt.window > 0 a row at p sees only keys at positions > p - window.
/// Throws InvalidArgument if query heads are not a multiple of KV heads.
ReferencePartial reference_attention(const DenseHistoryF64& h, const QueryRows& q, const AttentionOptions& opt);

/// Own-format error (SPEC §5): max over rows and heads of
/// |O_kernel - O_ref|_inf / |O_ref|_inf. A row empty in one and not the other,
/// a non-finite kernel output, or a non-zero error where |O_ref|_inf = 0 gives
/// +inf. Rows empty in both are skipped. Throws InvalidArgument on shape mismatch.
double own_format_error(const Partial& kernel, const ReferencePartial& ref);

}  // namespace activekv::attention
