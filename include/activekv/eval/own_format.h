// Own-format error along a route (SPEC §5 a) on one layer's history.
#pragma once

#include "activekv/attention/paged_attention.h"
#include "activekv/convert/compressed_history.h"
#include "activekv/eval/quality_eval.h"
#include "activekv/route/routed_attention.h"

namespace activekv::eval {

/// Max over rows and heads of |O_kernel - O_ref|_inf / |O_ref|_inf for the
/// query rows `q` ([n_rows][n_heads][head_dim] fp32, RoPE applied) read
/// along `cfg`'s route over layer `layer` of `h`, with the options the
/// model's forward uses for that layer: `opt.window` (a sliding-window layer
/// attends only keys in (p - window, p], so kernel and reference both see
/// only the window and the pages inside it), `opt.softmax_scale` and
/// `opt.int8s_query_terms`. O_ref is fp64 attention with the unquantised
/// query over the pages the route plans, each as the route reads it (exact
/// bf16, or the published compressed page dequantised).
/// `int8s_tile`: the int8s kernel to use (empty: the CPU one; an injected
/// kernel refuses a window, see route::attend_routed).
/// Throws InvalidArgument on shape mismatch.
double route_own_format_error(const attention::LayerHistory& h, int layer, convert::CompressedHistory& c,
                              const route::RouteConfig& cfg, const attention::QueryRows& q,
                              const attention::AttentionOptions& opt, const route::Int8sTileFn& int8s_tile = {});

/// One own-format sample (SampleError) of route `cand` at model layer
/// `layer` whose history is `h` (layer `history_layer` of `h`'s store and of
/// `c`: the model layer on the CPU, the global layer's store layer on the
/// GPU): the query rows `q` ([n_rows][n_heads][head_dim], RoPE applied) at
/// `pos`, with the layer's attention options (model::layer_attention_options)
/// and both query forms (two int8 terms, one term).
SampleError own_format_sample(const std::string& text, const route::RouteCandidate& cand, const model::ModelConfig& mc,
                              int layer, const attention::LayerHistory& h, int history_layer,
                              convert::CompressedHistory& c, const float* q, int n_rows, const int64_t* pos,
                              const route::Int8sTileFn& int8s_tile = {});

}  // namespace activekv::eval
