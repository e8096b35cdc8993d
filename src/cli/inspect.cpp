// `activekv inspect MODEL.gguf`: architecture, hyper-parameters, metadata,
// tensor types and counts, and the KV history bytes per token.
#include <fmt/format.h>

#include <map>

#include "activekv/gguf/gguf.h"
#include "activekv/model/config.h"
#include "commands.h"

namespace activekv::cli {
namespace {

void print_config(const gguf::File& f) {
  try {
    const model::ModelConfig c = model::ModelConfig::from_gguf(f);
    fmt::print("\nmodel\n");
    fmt::print("  layers {}, d_model {}, heads {} (KV heads {}, GQA group {}), head_dim {}\n", c.n_layers,
               c.d_model, c.n_heads, c.n_kv_heads, c.n_heads / c.n_kv_heads, c.head_dim);
    fmt::print("  ffn {}, vocab {}, trained context {}, output head {}\n", c.ffn_dim, c.vocab_size,
               c.context_length, c.tied_output ? "tied to token_embd" : "separate");
    fmt::print("  RoPE base {}, dims {}, layout {}; RMSNorm eps {}\n", c.rope_base, c.rope_dim,
               c.rope_layout == model::RopeLayout::Interleaved ? "interleaved pairs" : "half split", c.rms_eps);
    const size_t b = c.kv_bytes_per_token();
    fmt::print("  KV history (bf16): {} bytes/token; {:.1f} MiB at 4K, {:.1f} MiB at 32K, {:.1f} MiB at 128K\n", b,
               double(b) * 4096 / 1048576.0, double(b) * 32768 / 1048576.0, double(b) * 131072 / 1048576.0);
  } catch (const Error& e) {
    fmt::print("\nmodel: not runnable here: {}\n", e.what());
  }
}

int run(const std::string& path, bool all_tensors) {
  const gguf::File f = gguf::File::open(path);
  fmt::print("file       {}\n", path);
  fmt::print("GGUF       v{}, {} bytes, alignment {}, data at {}\n", f.version(), f.file_size(),
             f.alignment(), f.data_offset());
  fmt::print("arch       {}\n", f.get_string_or("general.architecture", "(none)"));
  fmt::print("\nmetadata ({} keys)\n", f.metadata().size());
  for (const auto& [key, value] : f.metadata()) fmt::print("  {:45s} {}\n", key, value.to_string(4));

  std::map<std::string, std::pair<size_t, uint64_t>> by_type;  // type -> (count, bytes)
  uint64_t params = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    auto& e = by_type[gguf::type_name(t.type)];
    e.first++;
    e.second += t.n_bytes;
    params += t.n_elements;
  }
  fmt::print("\ntensors ({}, {:.1f} M parameters)\n", f.tensors().size(), double(params) / 1e6);
  for (const auto& [type, e] : by_type) {
    fmt::print("  {:6s} {:5d} tensors {:10.2f} MiB\n", type, e.first, double(e.second) / 1048576.0);
  }
  if (all_tensors) {
    for (const gguf::TensorInfo& t : f.tensors()) {
      fmt::print("  {:40s} {:6s} [{}]\n", t.name, gguf::type_name(t.type), fmt::join(t.dims, ", "));
    }
  }
  print_config(f);
  return 0;
}

}  // namespace

void add_inspect(CLI::App& app, std::function<int()>& run_fn) {
  auto path = std::make_shared<std::string>();
  auto all = std::make_shared<bool>(false);
  app.add_option("model", *path, "GGUF model file")->required();
  app.add_flag("--tensors", *all, "List every tensor");
  run_fn = [path, all] { return run(*path, *all); };
}

}  // namespace activekv::cli
