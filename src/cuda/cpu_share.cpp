// The CPU's share of a decode step: side stream, pinned staging, host
// function. See cpu_share.h.
#include "cpu_share.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "cuda_check.h"

namespace activekv::cuda {

struct CpuShare::Task {
  CpuShare* self;
  std::shared_ptr<const CpuStepWork> work;  // alive until the host function ran
  int layer;
};

namespace {

// Pinned, and mapped so that kernels read it in place (the partials' gather).
float* pinned_floats(size_t n, const char* what) {
  void* p = nullptr;
  const cudaError_t st =
      cudaHostAlloc(&p, std::max<size_t>(n, 1) * sizeof(float), cudaHostAllocPortable | cudaHostAllocMapped);
  if (st != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(std::string("DecodeEngine (CPU share): pinning ") + std::to_string(n * sizeof(float)) +
                    " bytes for " + what + " failed: " + cudaGetErrorString(st));
  }
  return static_cast<float*>(p);
}

}  // namespace

CpuShare::CpuShare(const AttnShape& shape, const cpu::CpuAttentionOptions& opt) : shape_(shape), opt_(opt) {
  if (opt_.split_tokens != shape_.split_tokens)
    throw InvalidArgument("CpuShare: CPU splits of " + std::to_string(opt_.split_tokens) + " tokens, the engine's are " +
                          std::to_string(shape_.split_tokens));
  if (const char* e = std::getenv("ACTIVEKV_CPU_PARTIALS"); e && *e) {
    if (std::string(e) != "splits" && std::string(e) != "merged")
      throw InvalidArgument(std::string("ACTIVEKV_CPU_PARTIALS is '") + e + "': 'merged' (the default) or 'splits'");
    merge_runs_ = std::string(e) == "merged";
  }
  AKV_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  AKV_CUDA(cudaEventCreateWithFlags(&q_ready_, cudaEventDisableTiming));
  AKV_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

CpuShare::~CpuShare() {
  if (side_) cudaStreamSynchronize(side_);
  free_staging();
  if (q_ready_) cudaEventDestroy(q_ready_);
  if (done_) cudaEventDestroy(done_);
  if (side_) cudaStreamDestroy(side_);
}

void CpuShare::free_staging() {
  cudaFreeHost(q_host_);
  cudaFreeHost(stage_o_);
  cudaFreeHost(stage_lse_);
  q_host_ = stage_o_ = stage_lse_ = nullptr;
  dev_stage_o_ = dev_stage_lse_ = nullptr;
  cap_seq_ = cap_rows_ = 0;
}

void CpuShare::set_work(std::shared_ptr<const CpuStepWork> work, int n_seq) {
  if (size_t(n_seq) > cap_seq_ || work->max_rows > cap_rows_) {
    AKV_CUDA(cudaStreamSynchronize(side_));  // host functions in flight write the old staging
    free_staging();
    const size_t nq = size_t(shape_.n_q_heads()), hd = size_t(shape_.head_dim);
    const size_t seqs = std::max<size_t>(size_t(n_seq), 1), rows = std::max<size_t>(work->max_rows, 1);
    q_host_ = pinned_floats(seqs * nq * hd, "the queries");
    stage_o_ = pinned_floats(rows * nq * hd, "the partial outputs");
    stage_lse_ = pinned_floats(rows * nq, "the partial LSE");
    void* d = nullptr;
    AKV_CUDA(cudaHostGetDevicePointer(&d, stage_o_, 0));
    dev_stage_o_ = static_cast<const float*>(d);
    AKV_CUDA(cudaHostGetDevicePointer(&d, stage_lse_, 0));
    dev_stage_lse_ = static_cast<const float*>(d);
    cap_seq_ = seqs;
    cap_rows_ = rows;
  }
  work_ = std::move(work);
  n_seq_ = n_seq;
}

bool CpuShare::has_work(int layer) const {
  return work_ && size_t(layer) < work_->layers.size() && work_->layers[size_t(layer)].rows > 0;
}

void CpuShare::start_layer(int layer, const float* q, Partials parts, cudaStream_t compute) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  AKV_CUDA(cudaStreamIsCapturing(compute, &capturing));
  if (capturing != cudaStreamCaptureStatusNone)
    throw InvalidArgument("DecodeEngine: a step with CPU-attended pages cannot be captured in a CUDA graph");
  const CpuLayerWork& w = work_->layers[size_t(layer)];
  const size_t nq = size_t(shape_.n_q_heads()), hd = size_t(shape_.head_dim);
  AKV_CUDA(cudaEventRecord(q_ready_, compute));
  AKV_CUDA(cudaStreamWaitEvent(side_, q_ready_, 0));
  AKV_CUDA(cudaMemcpyAsync(q_host_, q, size_t(n_seq_) * nq * hd * sizeof(float), cudaMemcpyDeviceToHost, side_));
  auto task = std::make_unique<Task>(Task{this, work_, layer});
  AKV_CUDA(cudaLaunchHostFunc(side_, host_fn, task.get()));
  task.release();  // host_fn owns it now
  PartialRuns runs;
  for (size_t i = 0; i < w.runs.size(); ++i) {
    const CpuLayerWork::Run& r = w.runs[i];
    runs.run[runs.n++] =
        PartialRun{int64_t(r.seq) * parts.max_splits + r.split0, int64_t(r.stage_row), r.count, merge_runs_ ? 1 : r.count};
    if (runs.n == PartialRuns::kMax || i + 1 == w.runs.size()) {
      launch_gather_partials(runs, dev_stage_o_, dev_stage_lse_, parts, int(nq * hd), int(nq), side_);
      runs.n = 0;
    }
  }
  AKV_CUDA(cudaEventRecord(done_, side_));
}

void CpuShare::join_layer(cudaStream_t compute) { AKV_CUDA(cudaStreamWaitEvent(compute, done_, 0)); }

void CUDART_CB CpuShare::host_fn(void* p) {
  std::unique_ptr<Task> t(static_cast<Task*>(p));
  t->self->run(t->work->layers[size_t(t->layer)], t->layer);
}

// Runs on the driver's callback thread: no CUDA calls, no exception escapes.
void CpuShare::run(const CpuLayerWork& w, int layer) noexcept {
  const size_t nq = size_t(shape_.n_q_heads()), hd = size_t(shape_.head_dim);
  const auto start = std::chrono::steady_clock::now();
  try {
    const cpu::DecodeShape ds{shape_.n_kv_heads, shape_.group, shape_.head_dim, shape_.page_size,
                              shape_.softmax_scale};
    for (const CpuLayerWork::Seq& s : w.seqs)
      cpu::attend_pages_splits(ds, s.pages, q_host_ + size_t(s.seq) * nq * hd, opt_, ws_,
                               stage_o_ + s.stage_row * nq * hd, stage_lse_ + s.stage_row * nq);
    if (merge_runs_) {
      ranges_.clear();
      for (const CpuLayerWork::Run& r : w.runs) ranges_.push_back({r.stage_row, size_t(r.count)});
      cpu::merge_split_ranges(ds, ranges_, stage_o_, stage_lse_, opt_.threads, ws_);
    }
  } catch (...) {
    // Poison what the merge will read, and keep the error for synchronize().
    std::fill(stage_o_, stage_o_ + w.rows * nq * hd, std::numeric_limits<float>::quiet_NaN());
    std::fill(stage_lse_, stage_lse_ + w.rows * nq, std::numeric_limits<float>::quiet_NaN());
    const std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  const auto end = std::chrono::steady_clock::now();
  const std::lock_guard<std::mutex> lock(timing_mutex_);
  using ms = std::chrono::duration<double, std::milli>;
  timing_.busy_ms += ms(end - start).count();
  // Within a step only: a layer not after the last one starts a step (the
  // host is between steps before it).
  if (last_layer_ < 0 || layer <= last_layer_) {
    ++timing_.steps;
  } else {
    timing_.idle_ms += ms(start - last_end_).count();
  }
  ++timing_.layers;
  timing_.bytes += w.bytes;
  last_end_ = end;
  last_layer_ = layer;
}

DecodeEngine::CpuTiming CpuShare::timing() const {
  const std::lock_guard<std::mutex> lock(timing_mutex_);
  return timing_;
}

void CpuShare::reset_timing() {
  const std::lock_guard<std::mutex> lock(timing_mutex_);
  timing_ = {};
  last_layer_ = -1;
}

void CpuShare::rethrow_error() {
  std::exception_ptr e;
  {
    const std::lock_guard<std::mutex> lock(error_mutex_);
    std::swap(e, error_);
  }
  if (e) std::rethrow_exception(e);
}

void CpuShare::synchronize() {
  AKV_CUDA(cudaStreamSynchronize(side_));
  rethrow_error();
}

}  // namespace activekv::cuda
