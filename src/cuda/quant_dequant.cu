// Dequantisation of GGUF-typed weight rows on the GPU (quant_matvec.h):
// the embedding gather (fp32 rows) and bf16 rows for the prefill GEMM, both
// bit-identical to gguf::dequantize (then bf16.h's rounding).
//
// One thread per piece of a row: a 32-element unit for block types (read
// straight from global; these kernels are bounded by their output writes,
// 2-4 bytes per element against <= 1.1 read), 8 elements for float types.
#include <cuda_runtime.h>

#include <string>

#include "activekv/core/error.h"
#include "activekv/cuda/quant_matvec.h"
#include "quant_blocks.cuh"
#include "quant_split.cuh"

namespace activekv::cuda {

namespace {

constexpr int kThreads = 256;

/// Output element sinks: fp32 or bf16 bits, 8 elements per 16/32-byte store.
struct OutF32 {
  using Elem = float;
  __device__ static void store8(float* dst, const float* v) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
  __device__ static void fill8_nan(float* dst) {
    const float q = __uint_as_float(0x7fc00000u);
    const float v[8] = {q, q, q, q, q, q, q, q};
    store8(dst, v);
  }
};

struct OutBF16 {
  using Elem = uint16_t;
  __device__ static void store8(uint16_t* dst, const float* v) {
    uint32_t p[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i] = uint32_t(qblk::f32_to_bf16_bits(v[2 * i])) | (uint32_t(qblk::f32_to_bf16_bits(v[2 * i + 1])) << 16);
    }
    *reinterpret_cast<uint4*>(dst) = make_uint4(p[0], p[1], p[2], p[3]);
  }
  __device__ static void fill8_nan(uint16_t* dst) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u, 0x7fc07fc0u);
  }
};

/// Unit u of a block (any byte source, quant_blocks.cuh) into dst.
template <class T, class Out, class S>
__device__ __forceinline__ void decode_unit(const S& b, int u, typename Out::Elem* dst) {
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    float v[8];
    qblk::dequant4<T>(b, u, 2 * h, v);
    qblk::dequant4<T>(b, u, 2 * h + 1, v + 4);
    Out::store8(dst + 8 * h, v);
  }
}

/// Decodes piece p (elements T::kPiece * p ..) of row r into dst; kSplit:
/// the matrix is in the split layout (quant_split.cuh).
template <class T, class Out, bool kSplit>
__device__ __forceinline__ void decode_piece(const uint8_t* w, int64_t rows, int64_t row_bytes, int64_t cols,
                                             int64_t r, int64_t p, typename Out::Elem* dst) {
  if constexpr (T::kPiece == 32) {
    decode_unit<T, Out>(qsplit::block_at<T, kSplit>(w, rows, row_bytes, r, p / T::kUnits, cols / T::kElems),
                        int(p % T::kUnits), dst);
  } else {
    float v[8];
    T::decode8(w + r * row_bytes, 8 * p, v);
    Out::store8(dst, v);
  }
}

/// out row i = W row (ids ? ids[i] : row0 + i), for i < n_rows.
template <class T, class Out, bool kSplit>
__global__ void __launch_bounds__(kThreads)
    dequant_rows_kernel(const uint8_t* __restrict__ w, int64_t rows, int64_t row_bytes, int64_t cols,
                        const int32_t* __restrict__ ids, int64_t row0, int64_t n_rows,
                        typename Out::Elem* __restrict__ out) {
  constexpr int kPiece = T::kPiece;
  const int64_t pieces = cols / kPiece;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= n_rows * pieces) return;
  const int64_t i = t / pieces, p = t % pieces;
  typename Out::Elem* dst = out + i * cols + p * kPiece;
  const int64_t r = ids ? int64_t(ids[i]) : row0 + i;
  if (r < 0 || r >= rows) {  // only ids can be out of range (the host checks row0/n_rows)
    for (int k = 0; k < kPiece; k += 8) Out::fill8_nan(dst + k);
    return;
  }
  decode_piece<T, Out, kSplit>(w, rows, row_bytes, cols, r, p, dst);
}

template <class Out>
void launch_rows(const DeviceMatrix& w, const int32_t* ids, int64_t row0, int64_t n_rows,
                 typename Out::Elem* out, cudaStream_t stream) {
  const auto* wp = static_cast<const uint8_t*>(w.data);
  auto go = [&](auto t) {
    using T = decltype(t);
    const int64_t threads = n_rows * (w.cols / T::kPiece);
    const int64_t grid = (threads + kThreads - 1) / kThreads;
    if (grid > 0x7fffffff) throw InvalidArgument("dequantise: too many rows in one launch");
    qsplit::with_layout<T>(w.layout, [&](auto split) {
      dequant_rows_kernel<T, Out, decltype(split)::value><<<unsigned(grid), kThreads, 0, stream>>>(
          wp, w.rows, int64_t(w.row_bytes), w.cols, ids, row0, n_rows, out);
    });
  };
  if (!qblk::dispatch_block_type(w.type, go)) qblk::dispatch_float_type(w.type, go);
  check_cuda(cudaGetLastError(), "dequant_rows_kernel launch");
}

void check_out(const void* out, const char* who) {
  if (out == nullptr || reinterpret_cast<uintptr_t>(out) % 16 != 0) {
    throw InvalidArgument(std::string(who) + ": the output must be non-null and 16-byte aligned");
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, int64_t n, uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = qblk::f32_to_bf16_bits(x[i]);
}

}  // namespace

void launch_gather_rows_f32(const DeviceMatrix& w, const int32_t* ids, int n, float* out, cudaStream_t stream) {
  validate_matrix(w);
  if (n < 0) throw InvalidArgument("gather rows: n " + std::to_string(n) + " < 0");
  if (n == 0) return;
  if (ids == nullptr) throw InvalidArgument("gather rows: ids is null");
  check_out(out, "gather rows");
  launch_rows<OutF32>(w, ids, 0, n, out, stream);
}

void launch_dequantize_bf16(const DeviceMatrix& w, int64_t row0, int64_t n_rows, void* out_bf16,
                            cudaStream_t stream) {
  validate_matrix(w);
  if (row0 < 0 || n_rows < 0 || row0 + n_rows > w.rows) {
    throw InvalidArgument("dequantize bf16: rows [" + std::to_string(row0) + ", " + std::to_string(row0 + n_rows) +
                          ") outside the " + std::to_string(w.rows) + " rows of the " + gguf::type_name(w.type) +
                          " matrix");
  }
  if (n_rows == 0) return;
  check_out(out_bf16, "dequantize bf16");
  launch_rows<OutBF16>(w, nullptr, row0, n_rows, static_cast<uint16_t*>(out_bf16), stream);
}

void launch_f32_to_bf16(const float* x, int64_t n, void* out_bf16, cudaStream_t stream) {
  if (n < 0) throw InvalidArgument("f32 to bf16: n " + std::to_string(n) + " < 0");
  if (n == 0) return;
  if (x == nullptr || out_bf16 == nullptr) throw InvalidArgument("f32 to bf16: null pointer");
  f32_to_bf16_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      x, n, static_cast<uint16_t*>(out_bf16));
  check_cuda(cudaGetLastError(), "f32_to_bf16_kernel launch");
}

}  // namespace activekv::cuda
