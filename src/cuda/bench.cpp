// `bench decode`: decode-step latency of every kv-format, streamed and
// resident, beside its bus limit and the transfer model's prediction. See
// include/activekv/cuda/bench.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "activekv/cuda/bench.h"
#include "activekv/cuda/decode_engine.h"
#include "bench_pages.h"
#include "bench_util.h"

namespace activekv::cuda {

using namespace bench;

std::vector<int64_t> parse_sizes(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int64_t mult = 1;
    char last = item.back();
    if (last == 'k' || last == 'K') { mult = 1024; item.pop_back(); }
    try {
      size_t pos = 0;
      const long long v = std::stoll(item, &pos);
      if (pos != item.size() || v <= 0) throw std::invalid_argument("");
      out.push_back(v * mult);
    } catch (const std::exception&) {
      throw InvalidArgument("not a positive size: '" + item + "' (expected e.g. 32k,64k,131072)");
    }
  }
  if (out.empty()) throw InvalidArgument("empty size list '" + list + "'");
  return out;
}

namespace {

struct Record {
  std::string format, mode;
  int64_t context;
  int batch;
  double step_ms, step_ms_min, step_ms_max;
  double device_ms;      // compute-stream span of the step (cudaEvent), median
  double history_bytes;  // bytes the step's pages take across the bus (also for resident: what streaming would move)
  double bytes_per_step, gbps, bus_limit_ms, bus_limit_ratio, predicted_ms, chunk_gbps;
  size_t copies_per_step, largest_copy;
  int jobs_per_layer;
  bool bitwise_equal_resident;
  bool repeatable;
};

double predict_ms(const Profile& pr, const DecodeEngine& eng, int n_layers, int64_t splits_per_seq) {
  const int R = eng.config().ring_slots;
  const bool streamed = eng.config().mode == Mode::streamed;
  std::vector<double> comp_end;
  double copy_free = 0, comp_free = 0;
  for (int l = 0; l < n_layers; ++l) {
    const auto jobs = eng.job_info(l);
    for (size_t j = 0; j < jobs.size(); ++j) {
      const size_t k = comp_end.size();
      double copy_end = 0;
      if (streamed) {
        double start = copy_free;
        if (k >= size_t(R)) start = std::max(start, comp_end[k - R]);
        double t = 0;
        for (size_t b : jobs[j].copy_bytes) t += pr.copy_time_ms(double(b));
        copy_end = start + t;
        copy_free = copy_end;
      }
      double start = std::max(comp_free, copy_end);
      const auto& tk = jobs[j].tokens_by_kind;
      const double kernel = pr.kernel_time_ms(double(tk[0] + tk[2])) +
                            (tk[1] > 0 ? pr.int8s_kernel_time_ms(double(tk[1])) : 0.0) +
                            pr.unpack_ms_per_page * double((tk[2] + pr.attn.page_size - 1) / pr.attn.page_size);
      double end = start + kernel;
      if (j + 1 == jobs.size()) end += pr.merge_time_ms(double(splits_per_seq));
      comp_end.push_back(end);
      comp_free = end;
    }
  }
  return comp_free;
}

}  // namespace

namespace {

void print_table(const std::vector<Record>& records) {
  // llama-bench vocabulary: depth = context tokens, t/s = tokens generated per second.
  std::printf("\n| %-10s | %-15s | %7s | %5s | %9s | %17s | %8s | %9s | %6s | %9s | %6s |\n", "kv-format", "mode",
              "depth", "batch", "step ms", "min - max", "t/s", "bus ms", "ratio", "pred ms", "err %");
  std::printf("|%s|\n", std::string(130, '-').c_str());
  for (const auto& r : records)
    std::printf("| %-10s | %-15s | %7lld | %5d | %9.3f | %8.3f - %6.3f | %8.2f | %9.3f | %6.3f | %9.3f | %6.2f |\n",
                r.format.c_str(), r.mode.c_str(), static_cast<long long>(r.context), r.batch, r.step_ms,
                r.step_ms_min, r.step_ms_max, r.batch * 1000.0 / r.step_ms, r.bus_limit_ms, r.bus_limit_ratio,
                r.predicted_ms, 100.0 * (r.predicted_ms - r.step_ms) / r.step_ms);
}

const Record* find_record(const std::vector<Record>& rs, const std::string& f, const std::string& m, int64_t ctx,
                          int batch) {
  for (const Record& r : rs)
    if (r.format == f && r.mode == m && r.context == ctx && r.batch == batch) return &r;
  return nullptr;
}

void write_json(const BenchDecodeOptions& opt, const Profile& pr, const bench::HistorySet& hist,
                const std::vector<Record>& records) {
  const AttnShape& sh = opt.attn;
  std::ofstream f(opt.json_path);
  if (!f) throw Error("bench decode: cannot write " + opt.json_path);
  auto conv = [](const bench::HistorySet::Conversion& c) {
    return "{\"pages\": " + std::to_string(c.pages) + ", \"seconds\": " + jnum(c.seconds) +
           ", \"threads\": " + std::to_string(c.threads) + ", \"pages_per_s\": " +
           jnum(c.seconds > 0 ? double(c.pages) / c.seconds : 0.0) + "}";
  };
  f << "{\n  \"device\": " << jstr(pr.device) << ",\n  \"commit\": " << jstr(opt.commit)
    << ",\n  \"command\": " << jstr(opt.command) << ",\n  \"shape\": {\"n_layers\": " << opt.n_layers
    << ", \"n_kv_heads\": " << sh.n_kv_heads << ", \"n_q_heads\": " << sh.n_q_heads()
    << ", \"head_dim\": " << sh.head_dim << ", \"page_size\": " << sh.page_size
    << ", \"split_tokens\": " << sh.split_tokens << ", \"tile_pages\": " << opt.tile_pages
    << ", \"ring_slots\": " << opt.ring_slots << ", \"recent_pages\": " << opt.recent_pages << "},\n"
    << "  \"int8s_kernel\": {\"query_terms\": " << opt.int8s.query_terms
    << ", \"skip_unit_rescale\": " << (opt.int8s.skip_unit_rescale ? "true" : "false")
    << ", \"pow2_reference\": " << (opt.int8s.pow2_reference ? "true" : "false")
    << ", \"tensor_cores\": " << (opt.int8s.tensor_cores ? "true" : "false") << "},\n"
    << "  \"conversion_cpu\": {\"int8s\": " << conv(hist.int8s_conv) << ", \"lossless13\": "
    << conv(hist.lossless13_conv) << "},\n"
    << "  \"profile\": " << pr.to_json() << ",\n  \"records\": [\n";
  for (size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    f << "    {\"format\": " << jstr(r.format) << ", \"mode\": " << jstr(r.mode) << ", \"context\": " << r.context
      << ", \"depth\": " << r.context << ", \"batch\": " << r.batch << ", \"step_ms\": " << jnum(r.step_ms)
      << ", \"step_ms_min\": " << jnum(r.step_ms_min) << ", \"step_ms_max\": " << jnum(r.step_ms_max)
      << ", \"device_ms\": " << jnum(r.device_ms)
      << ", \"steps\": " << opt.steps << ", \"t_per_s\": " << jnum(r.batch * 1000.0 / r.step_ms)
      << ", \"history_bytes\": " << jnum(r.history_bytes)
      << ", \"bytes_per_step\": " << jnum(r.bytes_per_step) << ", \"gbps\": " << jnum(r.gbps)
      << ", \"copies_per_step\": " << r.copies_per_step << ", \"largest_copy\": " << r.largest_copy
      << ", \"jobs_per_layer\": " << r.jobs_per_layer << ", \"chunk_gbps\": " << jnum(r.chunk_gbps)
      << ", \"bus_limit_ms\": " << jnum(r.bus_limit_ms) << ", \"bus_limit_ratio\": " << jnum(r.bus_limit_ratio)
      << ", \"predicted_ms\": " << jnum(r.predicted_ms)
      << ", \"prediction_error\": " << jnum((r.predicted_ms - r.step_ms) / r.step_ms)
      << ", \"bitwise_equal_resident\": " << (r.bitwise_equal_resident ? "true" : "false")
      << ", \"repeatable\": " << (r.repeatable ? "true" : "false") << "}"
      << (i + 1 < records.size() ? ",\n" : "\n");
  }
  f << "  ]\n}\n";
  std::printf("\nJSON written to %s\n", opt.json_path.c_str());
}

// Batch 2 in one launch vs two batch-1 launches (SPEC §4 batched decode), resident device time.
void print_batching(const std::vector<Record>& rs) {
  bool header = false;
  for (const Record& r2 : rs) {
    if (r2.mode != "resident" || r2.batch != 2) continue;
    const Record* r1 = find_record(rs, r2.format, "resident", r2.context, 1);
    if (!r1) continue;
    if (!header) std::printf("\nbatched decode, resident device time per step (16 layers):\n"), header = true;
    std::printf("  %-10s depth %7lld: batch 2 in one launch %.3f ms, two batch-1 launches %.3f ms (ratio %.3f)\n",
                r2.format.c_str(), static_cast<long long>(r2.context), r2.device_ms, 2 * r1->device_ms,
                r2.device_ms / (2 * r1->device_ms));
  }
}

}  // namespace

int run_bench_decode(const BenchDecodeOptions& opt) {
  const AttnShape& sh = opt.attn;
  sh.validate();
  for (const auto& m : opt.modes)
    if (m != "streamed" && m != "resident" && m != "streamed-whole")
      throw InvalidArgument("bench decode: unknown mode '" + m + "' (streamed, streamed-whole, resident)");
  for (const auto& f : opt.formats)
    if (std::find(bench::route_names().begin(), bench::route_names().end(), f) == bench::route_names().end())
      throw InvalidArgument("bench decode: unknown --kv-format '" + f + "' (bf16, lossless13, int8s, hybrid)");
  if (opt.steps < 1 || opt.warmup < 0) throw InvalidArgument("bench decode: steps must be >= 1, warmup >= 0");
  for (int b : opt.batches)
    if (b < 1) throw InvalidArgument("bench decode: batch sizes must be >= 1, got " + std::to_string(b));
  require_gpu(opt.device, "bench decode");  // after the arguments: a typo is reported on any machine
  const int threads = opt.host_threads > 0 ? opt.host_threads : int(std::max(1u, std::thread::hardware_concurrency()));
  auto wants = [&](const char* f) { return std::find(opt.formats.begin(), opt.formats.end(), f) != opt.formats.end(); };

  CalibrateOptions copt;
  copt.attn = sh;
  copt.out_path = opt.profile_path;
  copt.device = opt.device;
  const Profile pr = calibrate(copt);

  const int64_t max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  std::printf("\nbench decode: %d layers, %d KV heads x %d, %d query heads, page %d tokens (bf16 %.1f MiB), "
              "kv-formats", opt.n_layers, sh.n_kv_heads, sh.head_dim, sh.n_q_heads(), sh.page_size,
              sh.page_bytes() / 1048576.0);
  for (const auto& f : opt.formats) std::printf(" %s", f.c_str());
  std::printf("\n");
  const auto t0 = std::chrono::steady_clock::now();
  const bench::HistorySet hist = bench::build_history(sh, opt.n_layers, max_batch, max_ctx,
                                                      wants("int8s") || wants("hybrid"), wants("lossless13"), threads);
  std::printf("  history ready in %.1f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // One engine per mode, reused across configurations (resident copies the pool to the GPU once).
  std::vector<std::string> modes{"resident"};  // first: the bitwise reference for the streamed modes
  for (const auto& m : opt.modes)
    if (m != "resident") modes.push_back(m);
  const bool want_resident = std::find(opt.modes.begin(), opt.modes.end(), "resident") != opt.modes.end();
  std::map<std::string, std::unique_ptr<DecodeEngine>> engines;
  for (const auto& mode : modes) {
    EngineConfig c;
    c.n_layers = opt.n_layers;
    c.attn = sh;
    c.mode = mode == "resident" ? Mode::resident : Mode::streamed;
    c.tile_pages = mode == "streamed-whole" ? 0 : opt.tile_pages;
    c.ring_slots = mode == "streamed-whole" ? 2 : opt.ring_slots;
    c.int8s = opt.int8s;
    try {
      engines[mode] = std::make_unique<DecodeEngine>(c, *hist.pool);
    } catch (const CudaError& e) {
      std::printf("  skip mode %s: %s\n", mode.c_str(), e.what());
    }
  }
  cudaEvent_t ev0, ev1;
  AKV_CUDA(cudaEventCreate(&ev0));
  AKV_CUDA(cudaEventCreate(&ev1));

  std::vector<Record> records;
  bool all_equal = true;
  for (const auto& format : opt.formats) {
    for (int batch : opt.batches) {
      for (int64_t ctx : opt.contexts) {
        const std::vector<SeqPages> seqs =
            bench::route_tables(hist, format, batch, ctx, opt.n_layers, sh.page_size, opt.recent_pages);
        const size_t qn = size_t(opt.n_layers) * batch * sh.n_q_heads() * sh.head_dim;
        DevBuf q(qn * sizeof(float)), out(qn * sizeof(float));
        fill_device_random(q.as<float>(), qn, uint64_t(ctx) * 31 + batch);
        std::vector<float> ref, cur, again;
        const int64_t splits = (ctx + sh.split_tokens - 1) / sh.split_tokens;
        for (const auto& mode : modes) {
          if (!engines.count(mode)) continue;
          DecodeEngine& eng = *engines[mode];
          try {
            eng.set_batch(seqs);
          } catch (const CudaError& e) {
            std::printf("  skip %s %s depth %lld batch %d: %s\n", format.c_str(), mode.c_str(),
                        static_cast<long long>(ctx), batch, e.what());
            continue;
          }
          std::vector<double> ms, dms;
          for (int i = 0; i < opt.warmup + opt.steps; ++i) {
            AKV_CUDA(cudaMemset(out.p, 0xff, qn * sizeof(float)));  // poison: every element must be rewritten
            eng.synchronize();
            AKV_CUDA(cudaDeviceSynchronize());
            const auto a = std::chrono::steady_clock::now();
            AKV_CUDA(cudaEventRecord(ev0, eng.compute_stream()));
            eng.enqueue_step(q.as<float>(), out.as<float>(), nullptr);
            AKV_CUDA(cudaEventRecord(ev1, eng.compute_stream()));
            AKV_CUDA(cudaStreamSynchronize(eng.compute_stream()));
            const auto b = std::chrono::steady_clock::now();
            float dev = 0;
            AKV_CUDA(cudaEventElapsedTime(&dev, ev0, ev1));
            if (i >= opt.warmup) {
              ms.push_back(std::chrono::duration<double, std::milli>(b - a).count());
              dms.push_back(dev);
            }
            if (i == opt.warmup || i == opt.warmup + opt.steps - 1) {
              std::vector<float>& dst = i == opt.warmup ? cur : again;
              dst.resize(qn);
              AKV_CUDA(cudaMemcpy(dst.data(), out.p, qn * sizeof(float), cudaMemcpyDeviceToHost));
            }
          }
          if (mode == "resident") ref = cur;
          if (mode == "resident" && !want_resident) continue;  // measured only as the reference
          Record r{};
          r.format = format;
          r.mode = mode;
          r.context = ctx;
          r.batch = batch;
          r.step_ms = median(ms);
          r.device_ms = median(dms);
          r.step_ms_min = *std::min_element(ms.begin(), ms.end());
          r.step_ms_max = *std::max_element(ms.begin(), ms.end());
          const bool streamed = mode != "resident";
          r.history_bytes = 0;
          for (int l = 0; l < opt.n_layers; ++l)
            for (const auto& ji : eng.job_info(l))
              for (size_t b : ji.copy_bytes) r.history_bytes += double(b);
          if (!streamed) {  // same tables: count the bytes a streamed step would move
            r.history_bytes = 0;
            for (const auto& s : seqs)
              for (const auto& t : s.tables)
                for (const auto& p : t) r.history_bytes += double((p.bytes + 255) / 256 * 256);
          }
          r.bytes_per_step = streamed ? double(eng.bytes_per_step()) : 0.0;
          r.copies_per_step = eng.copies_per_step();
          r.largest_copy = eng.largest_copy();
          r.jobs_per_layer = eng.jobs_per_layer();
          r.gbps = r.history_bytes / (r.step_ms * 1e6);
          const double chunk = streamed ? double(eng.largest_copy()) : double(opt.tile_pages) * sh.page_bytes();
          r.chunk_gbps = pr.bandwidth_gbps(chunk);
          r.bus_limit_ms = r.history_bytes / (r.chunk_gbps * 1e6);
          r.bus_limit_ratio = r.step_ms / r.bus_limit_ms;
          r.predicted_ms = predict_ms(pr, eng, opt.n_layers, splits);
          r.bitwise_equal_resident = !ref.empty() && std::memcmp(ref.data(), cur.data(), qn * sizeof(float)) == 0;
          r.repeatable = std::memcmp(cur.data(), again.data(), qn * sizeof(float)) == 0;
          bool finite = true;
          for (float v : cur) finite = finite && std::isfinite(v);
          if (!r.bitwise_equal_resident || !r.repeatable || !finite) all_equal = false;
          records.push_back(r);
          std::printf("  %-10s %-15s depth %7lld batch %d: %9.3f ms (min %.3f max %.3f, device %.3f), pred %.3f ms, "
                      "bus %.3f ms, ratio %.3f, bitwise==resident %s, repeatable %s\n",
                      format.c_str(), mode.c_str(), static_cast<long long>(ctx), batch, r.step_ms, r.step_ms_min,
                      r.step_ms_max, r.device_ms, r.predicted_ms, r.bus_limit_ms, r.bus_limit_ratio,
                      r.bitwise_equal_resident ? "yes" : "NO", r.repeatable ? "yes" : "NO");
          std::fflush(stdout);
        }
      }
    }
  }
  cudaEventDestroy(ev0);
  cudaEventDestroy(ev1);
  print_table(records);
  print_batching(records);
  if (!opt.json_path.empty()) write_json(opt, pr, hist, records);
  return all_equal ? 0 : 1;
}

}  // namespace activekv::cuda
