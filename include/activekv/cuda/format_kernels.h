// GPU kernels for the compressed page formats (SPEC §3.2, §3.3): int8s
// attention that reads the codes where they lie, and lossless13 unpacking
// into the bf16 layout so the exact kernel of decode_attention.h reads it.
//
// Both read *encoded page blobs* exactly as the host codecs write them
// (activekv/kv/codec.h: 64-byte header + payload; layouts in
// activekv/kv/codec_int8s.h and codec_lossless13.h). The GPU does not
// validate blobs: the host validates a page before it is published or handed
// to the engine (DecodeEngine::update checks every header). Every launch
// here is asynchronous on `stream`; argument errors throw InvalidArgument,
// CUDA errors CudaError.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "activekv/cuda/decode_attention.h"

namespace activekv::cuda {

/// Which int8s split kernel runs (both: the contract of launch_split_attention_int8s).
enum class Int8sKernel {
  /// int8s_attention.cu: CTA-wide staged 128-token blocks, scores through
  /// shared memory, P.V on CUDA cores; any group 1..8.
  legacy,
  /// int8s_tc_attention.cu (issue 13): per-warp cp.async rings, no CTA
  /// barrier in the main loop, q.k on int8 tensor cores and P.V on f16 tensor
  /// cores (V codes converted in registers, exact); group 3, 4, 6, 7 or 8
  /// (compile-time), split_tokens <= 4096. Ignores `tensor_cores`.
  tc,
  /// tc where the shape allows it, else legacy (the default: tc measured
  /// 2.0-3.0x faster on the H200, bench/results/h200_bench_decode_int8s_tc.json).
  automatic,
};

/// The kernel `k` runs for this shape: automatic resolved to tc or legacy.
Int8sKernel resolve_int8s_kernel(Int8sKernel k, const AttnShape& shape);

/// "legacy", "tc" or "auto"; anything else throws InvalidArgument naming the value.
Int8sKernel parse_int8s_kernel(const std::string& name);
/// The name parse_int8s_kernel takes.
const char* int8s_kernel_name(Int8sKernel k);

/// Launch configuration of the tc kernel (issue 13), fixed at compile time
/// per instantiation: `warps` per CTA (each with its own cp.async ring),
/// `stages` of that ring, `blocks` of 16 tokens per stage (a warp waits for
/// a stage once and runs its blocks), and `channel_rows`: P.V computed
/// transposed, channels in the mma rows, so that P's two f16 terms share one
/// accumulator (half the accumulator registers; int8s_tc_fragments.cuh).
/// single_v: the K codes of `stages` stages in the warp's ring but the V
/// codes of one (a stage's V copy starts once the previous block's P.V is
/// done; stages == 2, one block per stage): 12 KiB per warp at head_dim 256
/// instead of 16, so 4 CTAs of 4 warps fit an SM's shared memory.
/// Named "w<warps>s<stages>", then "b<blocks>" when blocks > 1, then "c"
/// for channel rows, then "v" for single_v, e.g. "w4s2", "w2s2b2", "w4s2c",
/// "w4s2cv". All zero (the
/// default) means: the environment variable ACTIVEKV_INT8S_TC_CONFIG if set
/// (read once per process), else w4s2cv for head_dim 256 (the fastest all
/// round in the H200 sweep of bench/gpu/int8s_sweep.sh) and w4s4 for 64.
/// Configurations differ only in which warp sums which tokens (fp32
/// summation order), never in the per-token arithmetic.
struct Int8sTcConfig {
  int warps = 0, stages = 0, blocks = 0;
  bool channel_rows = false;
  bool single_v = false;
  bool is_default() const { return warps == 0 && stages == 0 && blocks == 0 && !channel_rows && !single_v; }
};

/// The instantiated configurations' names, the defaults first.
const std::vector<std::string>& int8s_tc_config_names();
/// Parses a name of int8s_tc_config_names() ("" or "default": all zero);
/// anything else throws InvalidArgument listing the instantiated names.
Int8sTcConfig parse_int8s_tc_config(const std::string& name);
/// "w4s2", "w2s2b2", "w4s2c"; "default" for all zero.
std::string int8s_tc_config_name(const Int8sTcConfig& c);
/// The configuration the tc kernel runs for `c` and head_dim 64 or 256: `c`
/// itself unless default, else ACTIVEKV_INT8S_TC_CONFIG, else the per-head_dim
/// default. Throws InvalidArgument for a bad environment value (naming it).
Int8sTcConfig resolve_int8s_tc_config(const Int8sTcConfig& c, int head_dim);

/// Switches of the int8s kernel. Defaults are the measured choice.
struct Int8sKernelOptions {
  /// The kernel (`bench decode --int8s-kernel tc|legacy|auto` picks it).
  Int8sKernel kernel = Int8sKernel::automatic;
  /// int8 terms the channel-scaled query is split into: 1 = SPEC §3.3 as
  /// written; 2 = plus the rounding residual on a 127x finer grid (two dp4a
  /// dot products per key word; see docs/routing.md for why it is the default).
  int query_terms = 2;
  /// SPEC §4 trick 1: skip the accumulator rescale when every query head's
  /// factor in the CTA is exactly 1.0 (multiplying by 1.0 changes no bit).
  bool skip_unit_rescale = true;
  /// SPEC §4 trick 2: scores in base 2 against a running reference rounded
  /// up to an integer, so every rescale factor is an exact power of two and
  /// LSE = (reference + log2 l) ln 2. Off by default (measured: no gain).
  bool pow2_reference = false;
  /// Legacy kernel only: q.k on int8 tensor cores (mma.m16n8k32; the 8 query heads x 2 terms fill
  /// the 16 rows) instead of __dp4a on the CUDA cores. Integer sums are exact,
  /// so both give the same bits (tested); the faster is the default (measured
  /// on the H200, docs/formats-gpu.md).
  bool tensor_cores = true;
  /// tc kernel only: its launch configuration (Int8sTcConfig; default: the
  /// environment, else the measured default).
  Int8sTcConfig tc;
};

/// int8s split attention: same work list, grid, partial layout and merge as
/// launch_split_attention, but `SplitWork::page` points at an int8s blob
/// (header first) holding `shape.page_size` tokens, `shape.n_kv_heads` heads
/// of `shape.head_dim` channels. Per CTA (one split x one KV head; legacy:
/// 128 threads, tc: Int8sKernelOptions::tc, by default 4 warps): the channel scales c_j fold into each query head's row, the row
/// is quantised to int8 (one scale per row and page, round half to even,
/// clipped to +-127; the residual as a second term when query_terms == 2),
/// q.k runs in int32 on the raw key codes (int8 mma or __dp4a, see
/// Int8sKernelOptions::tensor_cores), the token scale s_t and the row
/// scale multiply after; online softmax in base 2 in fp32; P.V accumulates
/// p * value code in fp32 (tc: p as two f16 terms on the tensor cores, V
/// codes exact in f16) and the page's value scale v_j multiplies once at
/// the end (a split never crosses a page, so this is SPEC §3.3's page-boundary
/// rescale). Output: O normalised fp32 and LSE fp32 (natural log) per query head.
/// head_dim 64 or 256; page_size a multiple of 16; the tc kernel: group 3, 4,
/// 6, 7 or 8 and split_tokens <= 4096 (else InvalidArgument naming the value).
void launch_split_attention_int8s(const AttnShape& shape, const SplitWork* work, int n_work, const float* q,
                                  Partials partials, const Int8sKernelOptions& opt, cudaStream_t stream);

/// One lossless13 page to unpack: the blob at `src` (device, header first,
/// `src_bytes` long) is written as a bf16 page (layout of decode_attention.h)
/// at `dst` (device, 16-byte aligned, shape.page_bytes() long). Tokens at and
/// past the blob's n_tokens are not written.
struct UnpackWork {
  const void* src = nullptr;
  void* dst = nullptr;
  uint64_t src_bytes = 0;
};

/// Unpacks `n_items` lossless13 pages (device array `items`): grid
/// n_items x (2 n_kv_heads planes), each CTA decodes one plane, 8 values
/// (13 bytes) per thread step, table planes through a 32-entry exponent table
/// in shared memory, raw planes copied. The result is the original bf16 bits
/// (the format is lossless). A plane whose directory entry or extent does not
/// fit the blob is written as bf16 NaN (0x7fc0) instead of being read: a
/// corrupt page that slipped past the host shows up as NaN, never as an
/// out-of-bounds read.
void launch_unpack_lossless13(const AttnShape& shape, const UnpackWork* items, int n_items, cudaStream_t stream);

}  // namespace activekv::cuda
