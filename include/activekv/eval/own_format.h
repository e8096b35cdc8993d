// Internal: own-format error of a route on one layer history.
#pragma once

#include "activekv/convert/compressed_history.h"
#include "activekv/eval/quality_eval.h"
#include "activekv/route/routed_attention.h"

namespace activekv::eval {

/// Max over rows/heads of |O_kernel - O_ref|_inf / |O_ref|_inf for `q` read
/// along `cfg`'s route over layer `layer` (SPEC §5).
/// `query_terms`: int8 terms of the int8s kernels' query (AttentionOptions);
/// `int8s_tile`: the int8s kernel to use (empty: the CPU one).
double route_own_format_error(const attention::LayerHistory& h, int layer, convert::CompressedHistory& c,
                              const route::RouteConfig& cfg, const attention::QueryRows& q, int query_terms,
                              const route::Int8sTileFn& int8s_tile = {});

}  // namespace activekv::eval
