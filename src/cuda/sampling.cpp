// GpuSampler (activekv/cuda/sampling.h): parameter checks, scratch, and the
// order of the launches; the kernels are in sampling.cu.
#include "activekv/cuda/sampling.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "activekv/cuda/decode_attention.h"
#include "device_buffer.h"
#include "sampling_kernels.h"

namespace activekv::cuda {

namespace {
// top_k = 1 leaves one candidate, the argmax: the same token without a sort.
bool is_argmax(const model::SamplerParams& p) { return p.temperature <= 0.0f || p.top_k == 1; }
}  // namespace

// Only what the parameters need: greedy needs the argmax partials, sampling
// the sort buffers and the probabilities.
struct GpuSampler::Scratch {
  std::unique_ptr<DevBuf> part_val, part_idx;              // argmax
  std::unique_ptr<DevBuf> idx_in, keys, idx_out, sort_tmp;  // sort; idx_in = 0..vocab-1, written once
  std::unique_ptr<DevBuf> prob, part_sum;                  // probabilities, running sums
  size_t sort_bytes = 0;
  int k = 0;  // candidates after top-k
};

GpuSampler::GpuSampler(int vocab, model::SamplerParams params) : vocab_(vocab), params_(params) {
  params_.validate();
  if (vocab <= 0) throw InvalidArgument(fmt::format("GpuSampler: vocab must be positive, got {}", vocab));
  s_ = std::make_unique<Scratch>();
  Scratch& s = *s_;
  const size_t n = size_t(vocab);
  if (is_argmax(params_)) {
    const size_t parts = size_t(kernels::argmax_partials(vocab));
    s.part_val = std::make_unique<DevBuf>(parts * sizeof(float));
    s.part_idx = std::make_unique<DevBuf>(parts * sizeof(int));
    return;
  }
  s.k = params_.top_k > 0 && params_.top_k < vocab ? params_.top_k : vocab;
  s.idx_in = std::make_unique<DevBuf>(n * sizeof(int));
  s.keys = std::make_unique<DevBuf>(n * sizeof(float));
  s.idx_out = std::make_unique<DevBuf>(n * sizeof(int));
  s.sort_bytes = kernels::sort_scratch_bytes(vocab);
  s.sort_tmp = std::make_unique<DevBuf>(s.sort_bytes);
  s.prob = std::make_unique<DevBuf>(size_t(s.k) * sizeof(double));
  s.part_sum = std::make_unique<DevBuf>(size_t(kernels::prob_partials(s.k)) * sizeof(double));
  // Written once on the legacy default stream and waited for, so that any
  // stream of a later sample() sees it.
  kernels::iota(s.idx_in->as<int>(), vocab, nullptr);
  check_cuda(cudaStreamSynchronize(nullptr), "GpuSampler: writing the candidate ids");
}

GpuSampler::~GpuSampler() = default;

void GpuSampler::rewind(uint64_t draws) {
  if (draws > draws_)
    throw InvalidArgument(fmt::format("sampler: rewind to draw {} past the {} made", draws, draws_));
  draws_ = draws;
}

void GpuSampler::sample(const float* logits_dev, int32_t* token_dev, cudaStream_t stream) {
  if (logits_dev == nullptr) throw InvalidArgument("GpuSampler::sample: logits_dev is null");
  if (token_dev == nullptr) throw InvalidArgument("GpuSampler::sample: token_dev is null");
  const uint64_t draw = draws_++;  // every call counts, as model::Sampler's
  Scratch& s = *s_;
  if (is_argmax(params_)) {
    kernels::argmax(logits_dev, vocab_, s.part_val->as<float>(), s.part_idx->as<int>(), token_dev, stream);
    return;
  }
  kernels::sort_desc(s.sort_tmp->p, s.sort_bytes, logits_dev, s.keys->as<float>(), s.idx_in->as<int>(),
                     s.idx_out->as<int>(), vocab_, stream);
  kernels::sample_sorted(s.keys->as<float>(), s.idx_out->as<int>(), s.k, params_.temperature, params_.top_p,
                         params_.seed, draw, s.prob->as<double>(), s.part_sum->as<double>(), token_dev, stream);
}

}  // namespace activekv::cuda
