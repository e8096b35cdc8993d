// `activekv inspect MODEL.gguf`: architecture, hyper-parameters, metadata,
// tensor types and counts, and the KV history bytes per token; with
// --tensor-parallel N, what each of N GPUs would hold (model/tensor_split.h).
//
// The report is built in memory and printed only once complete, so a file
// that fails part-way prints its error line and nothing else.
#include <fmt/format.h>

#include <cstdio>
#include <iterator>
#include <map>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "activekv/model/tensor_split.h"
#include "commands.h"
#include "options.h"

namespace activekv::cli {
namespace {

using Out = fmt::memory_buffer;

template <class... Args>
void put(Out& out, fmt::format_string<Args...> format, Args&&... args) {
  fmt::format_to(std::back_inserter(out), format, std::forward<Args>(args)...);
}

/// The model section, or why the model cannot run here (the file itself is
/// valid GGUF, so the rest of the report still stands).
void put_config(Out& out, const gguf::File& f) {
  try {
    const model::ModelConfig c = model::ModelConfig::from_gguf(f);
    put(out, "\nmodel\n");
    put(out, "  layers {}, d_model {}, heads {} (KV heads {}, GQA group {}), head_dim {}\n", c.n_layers,
             c.d_model, c.n_heads, c.n_kv_heads, c.n_heads / c.n_kv_heads, c.head_dim);
    put(out, "  ffn {}, vocab {}, trained context {}, output head {}\n", c.ffn_dim, c.vocab_size,
             c.context_length, c.tied_output ? "tied to token_embd" : "separate");
    put(out, "  RoPE base {}, dims {}, layout {}; RMSNorm eps {}\n", c.rope_base, c.rope_dim,
             c.rope_layout == model::RopeLayout::Interleaved ? "interleaved pairs" : "half split", c.rms_eps);
    put(out, "  attention layers: {}", c.layer_split());
    if (c.n_sliding_layers() > 0) put(out, "; sliding layers' RoPE base {}", c.rope_base_local);
    put(out, "\n");
    const size_t b = c.kv_bytes_per_token();
    put(out, "  KV history (bf16): {} bytes/token; {:.1f} MiB at 4K, {:.1f} MiB at 32K, {:.1f} MiB at 128K\n", b,
             double(b) * 4096 / 1048576.0, double(b) * 32768 / 1048576.0, double(b) * 131072 / 1048576.0);
  } catch (const Error& e) {
    put(out, "\nmodel: not runnable here: {}\n", e.what());
  }
}

/// The tensor-parallel split over n GPUs, or why the model does not split so.
void put_split(Out& out, const gguf::File& f, int n) {
  put(out, "\ntensor parallel over {} GPU{} (what generate/bench --gpus load; docs/tensor-parallel.md)\n", n,
      n == 1 ? "" : "s");
  try {
    const model::ModelConfig c = model::ModelConfig::from_gguf(f);
    const model::ModelTensors t = model::ModelTensors::find(f, c);
    const model::TensorSplitPlan p = model::plan_tensor_split(c, t, n);
    // "KV head 2" for one, "KV heads 0-1" for several.
    const auto span = [](const char* one, int64_t first, int64_t count) {
      return count == 1 ? fmt::format("{} {}", one, first) : fmt::format("{}s {}-{}", one, first, first + count - 1);
    };
    for (int d = 0; d < n; ++d) {
      const model::ShardSplit& s = p.shards[size_t(d)];
      put(out, "  GPU {}: {}, {}, FFN rows {}-{}, output rows {}-{}, {:.1f} MiB of weights\n", d,
          span("KV head", s.kv_heads.head0, s.kv_heads.heads), span("query head", s.q_head0, s.q_heads), s.ffn0,
          s.ffn0 + s.ffn_rows - 1, s.vocab0, s.vocab0 + s.vocab_rows - 1, double(s.weight_bytes) / 1048576.0);
    }
  } catch (const Error& e) {
    put(out, "  does not split: {}\n", e.what());
  }
}

int run(const std::string& path, bool all_tensors, int tensor_parallel) {
  const gguf::File f = gguf::File::open(path);
  Out out;
  put(out, "file       {}\n", path);
  put(out, "GGUF       v{}, {} bytes, alignment {}, data at {}\n", f.version(), f.file_size(),
           f.alignment(), f.data_offset());
  put(out, "arch       {}\n", gguf::printable(f.get_string_or("general.architecture", "(none)")));
  put(out, "\nmetadata ({} keys)\n", f.metadata().size());
  for (const auto& [key, value] : f.metadata()) put(out, "  {:45s} {}\n", key, value.to_string(4));

  std::map<std::string, std::pair<size_t, uint64_t>> by_type;  // type -> (count, bytes)
  uint64_t params = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto& e = by_type[gguf::type_name(t.type)];
    e.first++;
    e.second += t.n_bytes;
    params += t.n_elements;
  }
  put(out, "\ntensors ({}, {:.1f} M parameters)\n", f.tensors().size(), double(params) / 1e6);
  for (const auto& [type, e] : by_type) {
    put(out, "  {:6s} {:5d} tensors {:10.2f} MiB\n", type, e.first, double(e.second) / 1048576.0);
  }
  if (all_tensors) {
    for (const gguf::TensorInfo& t : f.tensors()) {
      put(out, "  {:40s} {:6s} [{}]\n", t.name, gguf::type_name(t.type), fmt::join(t.dims, ", "));
    }
  }
  put_config(out, f);
  if (tensor_parallel > 0) put_split(out, f, tensor_parallel);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, std::function<int()>& run_fn) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  app.add_option("model", *path, "GGUF model file (default: as generate)")->check(non_empty());
  app.add_flag("--tensors", *all, "List every tensor");
  auto tp = std::make_shared<int>(0);
  app.add_option("--tensor-parallel", *tp, "Also print what each of N GPUs would hold split tensor-parallel")
      ->check(in_range(1, 64));
  run_fn = [path, all, tp] { return run(path->empty() ? default_model_path() : *path, *all, *tp); };
}

}  // namespace activekv::cli
