// `activekv eval`: the quality contract of SPEC §5 on real text. Prints a
// table and writes JSON records (one per route and text, plus one per route
// over all texts, plus the synthetic outlier case). With --passkey: the
// passkey retrieval check instead (eval_passkey.cpp).
#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "activekv/core/blas.h"
#include "activekv/core/error.h"
#include "activekv/core/text_file.h"
#include "activekv/eval/quality_eval.h"
#ifdef ACTIVEKV_HAVE_CUDA
#include "activekv/cuda/int8s_tile.h"
#include "activekv/eval/gpu_eval.h"
#endif
#include "activekv/tokenizer/tokenizer.h"
#include "commands.h"
#include "eval_passkey.h"
#include "memory.h"
#include "options.h"
#include "provenance.h"
#include "stats.h"

namespace activekv::cli {
namespace {

struct EvalArgs {
  std::string model;
  std::string data_dir = std::string(ACTIVEKV_SOURCE_DIR) + "/data/texts";  // shipped in the tree
  std::vector<std::string> texts{"wikitext2-test.raw", "pride-and-prejudice.txt", "tinyshakespeare.txt"};
  std::string json_out;
  int threads = default_threads();
  std::string device = "cpu";        ///< where the model runs: cpu (LlamaModel) or cuda (runtime::GpuRuntime)
  std::string int8s_kernel = "cpu";  ///< where the own-format samples' int8s kernel runs
  bool f32_activations = false;      ///< --device cuda: RuntimeOptions::f32_activations
  std::vector<std::string> routes{"lossless13", "int8s", "hybrid"};
  eval::EvalConfig cfg;
  bool passkey = false;        ///< run the passkey check instead of the text eval
  eval::PasskeyConfig pk;      ///< its depths, seed, answer length (sizes and routes come from cfg)
};

constexpr const char* kNoCuda = ": this build has no CUDA backend (configure with nvcc present, ACTIVEKV_CUDA=ON)";

// The int8s kernel of the own-format samples: the CPU reference, or a GPU
// kernel (a build with the CUDA backend): cuda = the legacy one, cuda-tc the
// tensor-core one of issue 13.
route::Int8sTileFn int8s_kernel(const std::string& kernel) {
  if (kernel == "cpu") return {};
  if (kernel != "cuda" && kernel != "cuda-tc")
    throw InvalidArgument("eval: --int8s-kernel must be cpu, cuda or cuda-tc, got '" + kernel + "'");
#ifdef ACTIVEKV_HAVE_CUDA
  cuda::require_gpu(0, "eval --int8s-kernel " + kernel);  // before minutes of CPU work, not after
  cuda::Int8sKernelOptions k;
  k.kernel = kernel == "cuda-tc" ? cuda::Int8sKernel::tc : cuda::Int8sKernel::legacy;
  return cuda::Int8sTileRunner{k};
#else
  throw InvalidArgument("eval: --int8s-kernel " + kernel + kNoCuda);
#endif
}

// Where the model runs; refuses cuda without the CUDA backend.
void check_device(const EvalArgs& a) {
  if (a.device != "cpu" && a.device != "cuda")
    throw InvalidArgument("eval: --device must be cpu or cuda, got '" + a.device + "'");
#ifdef ACTIVEKV_HAVE_CUDA
  if (a.device == "cuda") cuda::require_gpu(0, "eval --device cuda");  // before loading and tokenizing, not after
#else
  if (a.device == "cuda") throw InvalidArgument(std::string("eval: --device cuda") + kNoCuda);
#endif
  if (a.device == "cpu" && a.f32_activations)
    throw InvalidArgument("eval: --f32-activations is for --device cuda (the CPU path is fp32 throughout)");
}

// The JSON fields that say where the model ran: "device", "placement" (the
// GPU runtime's history placement, null on the CPU) and "activations" (the
// projections' activations: "f32" on the CPU or with --f32-activations,
// else "int8" -- the GPU's int8 decode matvecs and bf16 prefill GEMMs).
nlohmann::json device_fields(const EvalArgs& a, const std::string& placement) {
  return {{"device", a.device},
          {"placement", placement.empty() ? nlohmann::json(nullptr) : nlohmann::json(placement)},
          {"activations", a.device == "cpu" || a.f32_activations ? "f32" : "int8"}};
}

#ifdef ACTIVEKV_HAVE_CUDA
eval::GpuEvalOptions gpu_options(const EvalArgs& a) {
  eval::GpuEvalOptions g;
  g.f32_activations = a.f32_activations;
  return g;
}
#endif

// A measured error, or null where the route had no samples (-1).
nlohmann::json optional(double error) { return error < 0 ? nlohmann::json(nullptr) : nlohmann::json(error); }
std::string cell(double error) { return error < 0 ? "-" : fmt::format("{:.5f}", error); }

// Per-route aggregate over texts: equal-weight scored tokens per text.
nlohmann::json aggregate(const std::vector<eval::RouteQuality>& rows, const std::string& route) {
  double nll = 0, nll_exact = 0, top1 = 0, kl = 0, bytes = 0, per_token = 0, compressed = 0;
  int n = 0;
  bool bitwise = true;
  for (const auto& r : rows) {
    if (r.route != route) continue;
    nll += std::log(r.ppl);
    nll_exact += std::log(r.ppl / (1.0 + r.ppl_increase_pct / 100.0));
    top1 += r.top1_agreement;
    kl += r.mean_kl;
    bytes += r.bytes_per_step;
    per_token += r.bytes_per_token;
    compressed += r.compressed_page_fraction;
    bitwise = bitwise && r.bitwise_equal_to_exact;
    ++n;
  }
  const double ppl = std::exp(nll / n), ppl_exact = std::exp(nll_exact / n);
  return {{"ppl", ppl}, {"ppl_increase_pct", 100.0 * (ppl / ppl_exact - 1.0)}, {"top1_agreement", top1 / n},
          {"mean_kl", kl / n}, {"bitwise_equal_to_exact", bitwise}, {"history_bytes_per_step", bytes / n},
          {"history_bytes_per_token", per_token / n},
          {"compressed_page_fraction", compressed / n}};
}

int run(EvalArgs& a) {
  omp_set_num_threads(a.threads);
  set_blas_threads(a.threads);
  check_device(a);
  a.cfg.int8s_tile = int8s_kernel(a.int8s_kernel);
  a.cfg.routes.clear();
  route::RouteConfig defaults;
  defaults.recent_pages = a.cfg.recent_pages;
  defaults.tile_pages = a.cfg.tile_pages;
  std::vector<std::string> specs;
  try {
    specs = route::join_candidate_parts(a.routes);  // "hybrid:recent=8", "sink=2" arrive split at the comma
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("eval: --routes: ") + e.what());
  }
  for (const auto& r : specs) {
    try {
      a.cfg.routes.push_back(route::parse_candidate(r, defaults));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string("eval: --routes: ") + e.what());
    }
    if (a.cfg.routes.back().config.kind == route::RouteKind::exact)
      throw InvalidArgument("eval: --routes: exact is always scored as the baseline, not a candidate");
  }
  const std::string model_path = a.model.empty() ? default_model_path() : a.model;
  const std::string model_name = std::filesystem::path(model_path).stem().string();
  const std::string out =
      a.json_out.empty() ? (a.passkey ? "passkey-" : "eval-") + model_name + ".json" : a.json_out;
  a.cfg.text_files.clear();
  for (const auto& t : a.texts) a.cfg.text_files.push_back(std::filesystem::path(t).is_absolute() ? t : a.data_dir + "/" + t);
  check_writable(out, "eval --json output");  // before minutes of work, not after
  std::vector<std::string> inputs{model_path};
  if (!a.passkey) inputs.insert(inputs.end(), a.cfg.text_files.begin(), a.cfg.text_files.end());
  check_not_an_input(out, inputs, "eval --json output");
  if (a.passkey && a.int8s_kernel != "cpu")
    throw InvalidArgument("eval --passkey: --int8s-kernel is the own-format samples' kernel; the passkey check has none");
  const gguf::File file = gguf::File::open(model_path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  // The model backend: the CPU forward, or the GPU runtime (no CPU copy of the weights).
  std::optional<model::LlamaModel> lm;
  if (a.device == "cpu") lm.emplace(load_weights_checked(file, model_path, [&] { return model::LlamaModel(file); }));
  const model::ModelConfig mc = lm ? lm->config() : model::ModelConfig::from_gguf(file);
  std::string placement;  // where the GPU runtime kept the history (its last run's)
  if (a.passkey) {
    a.pk.context = a.cfg.context;
    a.pk.page_size = a.cfg.page_size;
    a.pk.routes = a.cfg.routes;
    std::unique_ptr<eval::PasskeyModel> backend;
#ifdef ACTIVEKV_HAVE_CUDA
    eval::GpuPasskeyModel* gpu = nullptr;
    if (!lm) {
      auto g = std::make_unique<eval::GpuPasskeyModel>(file, mc, a.pk.context, a.pk.page_size, gpu_options(a));
      gpu = g.get();
      backend = std::move(g);
    }
    const auto where = [&] { return device_fields(a, gpu ? route::placement_name(gpu->last_stats().placement.placement) : ""); };
#else
    const auto where = [&] { return device_fields(a, ""); };
#endif
    if (lm) backend = eval::cpu_passkey_model(*lm, a.pk);
    return run_passkey_eval(*backend, tok, a.pk, model_name, out, where);
  }

  std::unique_ptr<eval::WindowScorer> scorer;
#ifdef ACTIVEKV_HAVE_CUDA
  eval::GpuScorer* gpu = nullptr;
  if (!lm) {
    auto g = std::make_unique<eval::GpuScorer>(file, mc, a.cfg, gpu_options(a));
    gpu = g.get();
    scorer = std::move(g);
  }
#endif
  if (lm) scorer = eval::cpu_scorer(*lm, a.cfg);
  const std::string commit = git_commit();  // the tree this run started from
  const auto t0 = std::chrono::steady_clock::now();
  const eval::EvalResult r = eval::run_quality_eval(
      *scorer, [&](const std::string& text) { return tok.encode(text, tok.add_bos_default()); }, a.cfg,
      [&](const std::string& line) { fmt::print(stderr, "[eval {:6.0f} s] {}\n", ms_since(t0) / 1000.0, line); });
#ifdef ACTIVEKV_HAVE_CUDA
  if (gpu) placement = route::placement_name(gpu->last_stats().placement.placement);
#endif

  std::vector<std::string> routes{"exact"};
  for (const auto& c : a.cfg.routes) routes.push_back(c.name);
  std::map<std::string, std::string> all_label;  // route -> "all (N samples)"
  for (const auto& route : routes) {
    int n = 0;
    for (const auto& s : r.samples) n += s.route == route;
    all_label[route] = "all (" + std::to_string(n) + " samples)";
  }
  // The text column is as wide as its longest entry, so that the columns stay aligned.
  size_t tw = 4;
  for (const auto& q : r.routes) tw = std::max(tw, q.text.size());
  for (const auto& [route, label] : all_label) tw = std::max(tw, label.size());
  fmt::print("\n{:12s} {:{}s} {:>9s} {:>8s} {:>9s} {:>10s} {:>9s} {:>9s} {:>10s} {:>8s}\n", "route", "text", tw, "ppl",
             "dppl %", "top-1", "mean KL", "own err", "(1-term)", "MiB/step", "bitwise");
  nlohmann::json records = nlohmann::json::array();
  auto base = [&](const std::string& route, const std::string& text) {
    return nlohmann::json{{"format", route}, {"model", model_name}, {"text", text}, {"context", a.cfg.context},
                          {"scored_tokens", a.cfg.scored}, {"page_size", a.cfg.page_size},
                          {"recent_pages", a.cfg.recent_pages}, {"int8s_kernel", a.int8s_kernel},
                          {"commit", commit}, {"command", command_line()}};
  };
  const nlohmann::json where = device_fields(a, placement);
  for (const auto& q : r.routes) {
    int n = 0;
    double worst = -1, worst1 = -1;
    for (const auto& s : r.samples) {
      if (s.route == q.route && s.text == q.text) {
        ++n;
        worst = std::max(worst, s.error);
        worst1 = std::max(worst1, s.error_one_term);
      }
    }
    fmt::print("{:12s} {:{}s} {:9.4f} {:8.3f} {:9.4f} {:10.2e} {:>9s} {:>9s} {:10.2f} {:>8s}\n", q.route, q.text, tw, q.ppl,
               q.ppl_increase_pct, q.top1_agreement, q.mean_kl, cell(worst), cell(worst1), q.bytes_per_step / 1048576.0,
               q.bitwise_equal_to_exact ? "yes" : "no");
    nlohmann::json j = base(q.route, q.text);
    j.update(where);
    j.update({{"n_samples", n}, {"own_format_error", optional(worst)},
              {"own_format_error_one_term_query", optional(worst1)}, {"ppl", q.ppl}, {"ppl_increase_pct", q.ppl_increase_pct},
              {"top1_agreement", q.top1_agreement}, {"mean_kl", q.mean_kl},
              {"bitwise_equal_to_exact", q.bitwise_equal_to_exact}, {"history_bytes_per_step", q.bytes_per_step},
              {"history_bytes_per_token", q.bytes_per_token},
              {"compressed_page_fraction", q.compressed_page_fraction}});
    records.push_back(j);
  }
  for (const auto& route : routes) {
    nlohmann::json j = base(route, "all");
    j.update(where);
    int n = 0;
    for (const auto& s : r.samples) n += s.route == route;
    j.update(aggregate(r.routes, route));
    j.update({{"n_samples", n}, {"own_format_error", optional(r.worst_sample_error(route))},
              {"own_format_error_one_term_query", optional(r.worst_sample_error(route, true))}});
    records.push_back(j);
    fmt::print("{:12s} {:{}s} {:9.4f} {:8.3f} {:9.4f} {:10.2e} {:>9s} {:>9s}\n", route, all_label[route], tw, j["ppl"].get<double>(), j["ppl_increase_pct"].get<double>(),
               j["top1_agreement"].get<double>(), j["mean_kl"].get<double>(), cell(r.worst_sample_error(route)),
               cell(r.worst_sample_error(route, true)));
  }
  if (a.cfg.synthetic_tokens > 0) {
    const auto& s = r.synthetic;
    fmt::print("\nsynthetic {} tokens, outlier key channels, own-format error (bound 0.005):\n"
               "  two-term int8 query (default): int8s {:.5f}, plain per-token keys {:.5f}\n"
               "  one-term int8 query (SPEC 3.3 as written): int8s {:.5f}, plain per-token keys {:.5f}\n",
               a.cfg.synthetic_tokens, s.separable[1], s.per_token[1], s.separable[0], s.per_token[0]);
    nlohmann::json j = base("int8s", "synthetic-outliers");  // no model: no device fields
    j.update({{"context", a.cfg.synthetic_tokens}, {"n_samples", 1}, {"own_format_error", s.separable[1]},
              {"own_format_error_one_term_query", s.separable[0]},
              {"per_token_quantiser_error", s.per_token[1]},
              {"per_token_quantiser_error_one_term_query", s.per_token[0]}});
    records.push_back(j);
  }
  write_text_file(out, records.dump(2) + "\n", "eval --json output");
  fmt::print(stderr, "wrote {} ({} records) in {:.0f} s\n", out, records.size(), ms_since(t0) / 1000.0);
  return 0;
}

}  // namespace

void add_eval(CLI::App& app, std::function<int()>& run_fn) {
  auto a = std::make_shared<EvalArgs>();
  app.add_option("-m,--model", a->model, "GGUF model file (default: the installed SmolLM2-135M-Instruct)")
      ->check(non_empty());
  app.add_option("--data-dir", a->data_dir, "Folder of the real texts")->capture_default_str();
  app.add_option("--texts", a->texts, "Text files (names in --data-dir, or absolute paths)")->capture_default_str();
  app.add_option("-c,--ctx-size", a->cfg.context, "Window tokens per text (prefix + scored)")->capture_default_str()
      ->check(count_range(2));
  app.add_option("--scored", a->cfg.scored, "Tokens scored at the end of each window (fewer than -c)")
      ->capture_default_str()->check(count_range(1));
  add_page_size_option(app, a->cfg.page_size);
  add_recent_pages_option(app, a->cfg.recent_pages);
  app.add_option("--layers-per-text", a->cfg.layers_per_text, "Own-format samples (layers) per text")
      ->capture_default_str()->check(count_range(1));
  app.add_option("--query-rows", a->cfg.query_rows, "Query rows per sample (at most --scored)")->capture_default_str()
      ->check(count_range(1));
  app.add_option("--synthetic-tokens", a->cfg.synthetic_tokens, "Synthetic outlier case length (0: skip)")
      ->capture_default_str()->check(count_range(0));
  app.add_option("--json", a->json_out, "Output JSON (default: eval-<model>.json)")->check(non_empty());
  add_threads_option(app, a->threads);
  app.add_option("--routes", a->routes, "Routes scored against exact: lossless13, int8s, hybrid, or a hybrid "
                                        "candidate with parameters, e.g. hybrid:recent=8,sink=2 (docs/routing.md)")
      ->delimiter(',')->capture_default_str();
  app.add_option("--device", a->device, "Where the model runs: cpu (the CPU forward) or cuda (the GPU runtime, "
                                        "as generate --device cuda: each route decodes the scored tokens one step "
                                        "each, history in host pages)")->capture_default_str();
  app.add_option("--int8s-kernel", a->int8s_kernel, "Where the own-format samples' int8s kernel runs: cpu, cuda "
                                                    "(the GPU kernel) or cuda-tc (the GPU tensor-core kernel)")
      ->capture_default_str();
  app.add_flag("--f32-activations", a->f32_activations, "--device cuda: projections with fp32 activations (the "
                                                        "CPU path's arithmetic) instead of the runtime's default "
                                                        "int8 decode / bf16 prefill ones");
  app.add_flag("--passkey", a->passkey, "Run the passkey retrieval check instead (a key planted at --depths of a "
                                      "-c token filler prompt; per depth and route: retrieved, agrees with exact)");
  app.add_option("--depths", a->pk.depths, "--passkey: needle depths, fractions of the prompt")
      ->delimiter(',')->capture_default_str()->check(in_range(0.0, 1.0));
  app.add_option("--seed", a->pk.seed, "--passkey: seed of the keys")->capture_default_str()
      ->check(in_range(0LL, std::numeric_limits<long long>::max()));
  app.add_option("--answer-tokens", a->pk.answer_tokens, "--passkey: greedy tokens per answer")
      ->capture_default_str()->check(count_range(1));
  // A flag of the other mode would be ignored without a word: refuse it.
  const std::vector<std::string> perplexity_only{"--texts", "--data-dir", "--scored", "--layers-per-text",
                                                 "--query-rows", "--synthetic-tokens"};
  const std::vector<std::string> passkey_only{"--depths", "--seed", "--answer-tokens"};
  run_fn = [a, sub = &app, perplexity_only, passkey_only] {
    for (const std::string& f : a->passkey ? perplexity_only : passkey_only)
      if (sub->count(f) > 0)
        throw InvalidArgument(a->passkey ? "eval --passkey: " + f + " applies to the perplexity eval, not --passkey"
                                         : "eval: " + f + " applies to --passkey only");
    return run(*a);
  };
}

}  // namespace activekv::cli
