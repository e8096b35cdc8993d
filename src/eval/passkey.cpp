// The passkey retrieval check. See include/activekv/eval/passkey.h.
#include "activekv/eval/passkey.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "activekv/convert/compressed_history.h"
#include "activekv/core/error.h"
#include "activekv/model/sampler.h"

namespace activekv::eval {
namespace {

// The prompt's pieces (the usual passkey prompt of the long-context literature).
constexpr const char* kIntro =
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there.";
constexpr const char* kFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr const char* kQuestion = " What is the pass key? The pass key is";

std::string needle(const std::string& key) {
  return " The pass key is " + key + ". Remember it. " + key + " is the pass key.";
}

void validate(const PasskeyConfig& c) {
  if (c.depths.empty()) throw InvalidArgument("passkey: no depths");
  for (double d : c.depths)
    if (!(d >= 0.0 && d <= 1.0)) throw InvalidArgument(fmt::format("passkey: depth {} is outside [0, 1]", d));
  if (c.context <= 0 || c.answer_tokens <= 0 || c.page_size <= 0 || c.tile_pages <= 0)
    throw InvalidArgument(fmt::format("passkey: sizes must be positive (context {}, answer tokens {}, page {}, tile "
                                      "pages {})", c.context, c.answer_tokens, c.page_size, c.tile_pages));
  if (c.answer_tokens >= c.context)
    throw InvalidArgument(fmt::format("passkey: --answer-tokens {} must be below the context -c {}", c.answer_tokens,
                                      c.context));
}

void append(std::vector<int32_t>& ids, const std::vector<int32_t>& piece) { ids.insert(ids.end(), piece.begin(), piece.end()); }

// The CPU backend: one page store per depth, shared by its routes.
class CpuPasskeyModel final : public PasskeyModel {
 public:
  CpuPasskeyModel(model::LlamaModel& m, const PasskeyConfig& cfg)
      : m_(m), pages_(size_t((cfg.context + cfg.page_size - 1) / cfg.page_size)), page_size_(cfg.page_size) {}

  void begin_prompt(std::span<const int32_t> prefix) override {
    compressed_.reset();  // before the sequence and store it reads
    seq_.reset();
    store_ = std::make_unique<kv::PageStore>(m_.kv_shape(page_size_), pages_ * size_t(m_.config().n_layers));
    seq_ = std::make_unique<kv::SequenceKv>(*store_);
    m_.prefill(prefix, *seq_);
    prefix_ = int64_t(prefix.size());
    compressed_ = std::make_unique<convert::CompressedHistory>(
        *seq_, std::vector<kv::CodecFormat>{kv::CodecFormat::lossless13, kv::CodecFormat::int8s}, pages_, nullptr);
    compressed_->schedule();  // every full page, synchronously
  }

  // The question in one forward along the route, then one token at a time.
  std::vector<int32_t> answer(const route::RouteConfig& rc, std::span<const int32_t> question, int n,
                              const Tokenizer& tok, route::RouteReport& read) override {
    const route::RoutedView view{compressed_.get(), rc, &read};
    seq_->truncate(prefix_);
    std::vector<float> logits(size_t(m_.config().vocab_size));
    m_.forward(question, *seq_, logits, false, &view);
    std::vector<int32_t> out;
    for (;;) {
      const int32_t next = model::argmax(logits);
      out.push_back(next);
      if (int(out.size()) == n || tok.is_end_of_generation(next)) return out;
      m_.forward(std::span<const int32_t>(&out.back(), 1), *seq_, logits, false, &view);
    }
  }

 private:
  model::LlamaModel& m_;
  size_t pages_;
  int page_size_;
  int64_t prefix_ = 0;
  std::unique_ptr<kv::PageStore> store_;
  std::unique_ptr<kv::SequenceKv> seq_;
  std::unique_ptr<convert::CompressedHistory> compressed_;
};

}  // namespace

double PasskeyResult::retrieval_rate(const std::string& route) const {
  int n = 0, hit = 0;
  for (const PasskeyAnswer& a : answers)
    if (a.route == route) ++n, hit += a.retrieved;
  return n ? double(hit) / n : 0.0;
}

double PasskeyResult::agreement_rate(const std::string& route) const {
  int n = 0, same = 0;
  for (const PasskeyAnswer& a : answers)
    if (a.route == route) ++n, same += a.agrees_with_exact;
  return n ? double(same) / n : 0.0;
}

std::vector<std::string> passkey_keys(uint64_t seed, size_t n) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> five_digits(10000, 99999);
  std::vector<std::string> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(std::to_string(five_digits(rng)));
  return keys;
}

std::vector<int32_t> passkey_prompt(const Tokenizer& tok, const std::string& key, double depth, int context,
                                    int answer_tokens, int64_t* needle_token) {
  if (!(depth >= 0.0 && depth <= 1.0)) throw InvalidArgument(fmt::format("passkey: depth {} is outside [0, 1]", depth));
  const std::vector<int32_t> intro = tok.encode(kIntro, tok.add_bos_default(), false);
  const std::vector<int32_t> filler = tok.encode(kFiller, false, false);
  const std::vector<int32_t> plant = tok.encode(needle(key), false, false);
  const std::vector<int32_t> question = tok.encode(kQuestion, false, false);
  const int64_t fixed = int64_t(intro.size() + plant.size() + question.size()) + answer_tokens;
  const int64_t n_fillers = (int64_t(context) - fixed) / int64_t(filler.size());
  if (n_fillers < 1) {
    throw InvalidArgument(fmt::format("passkey: context {} is too short for the prompt ({} tokens without filler, "
                                      "{} per filler sentence)", context, fixed, filler.size()));
  }
  const int64_t before = std::llround(depth * double(n_fillers));
  std::vector<int32_t> ids = intro;
  ids.reserve(size_t(context));
  for (int64_t i = 0; i < before; ++i) append(ids, filler);
  if (needle_token) *needle_token = int64_t(ids.size());
  append(ids, plant);
  for (int64_t i = before; i < n_fillers; ++i) append(ids, filler);
  append(ids, question);
  return ids;
}

std::unique_ptr<PasskeyModel> cpu_passkey_model(model::LlamaModel& m, const PasskeyConfig& cfg) {
  validate(cfg);
  return std::make_unique<CpuPasskeyModel>(m, cfg);
}

PasskeyResult run_passkey(model::LlamaModel& m, const Tokenizer& tok, const PasskeyConfig& cfg,
                          const Progress& progress) {
  return run_passkey(*cpu_passkey_model(m, cfg), tok, cfg, progress);
}

PasskeyResult run_passkey(PasskeyModel& backend, const Tokenizer& tok, const PasskeyConfig& cfg,
                          const Progress& progress) {
  validate(cfg);
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const size_t question_tokens = tok.encode(kQuestion, false, false).size();
  const std::vector<std::string> keys = passkey_keys(cfg.seed, cfg.depths.size());
  std::vector<route::RouteCandidate> routes{{"exact", route::RouteConfig{}}};
  routes.insert(routes.end(), cfg.routes.begin(), cfg.routes.end());
  PasskeyResult result;

  for (size_t d = 0; d < cfg.depths.size(); ++d) {
    int64_t needle_at = 0;
    const std::vector<int32_t> ids = passkey_prompt(tok, keys[d], cfg.depths[d], cfg.context, cfg.answer_tokens, &needle_at);
    result.prompt_tokens = int64_t(ids.size());
    const std::span<const int32_t> all(ids);
    const size_t prefix = ids.size() - question_tokens;

    say(fmt::format("depth {:.2f}: key {} at token {} of {}; prefill {} tokens (exact)", cfg.depths[d], keys[d],
                    needle_at, ids.size(), prefix));
    backend.begin_prompt(all.first(prefix));

    std::vector<int32_t> exact_answer;
    for (const route::RouteCandidate& cand : routes) {
      route::RouteReport report;
      route::RouteConfig rc = cand.config;
      rc.tile_pages = cfg.tile_pages;
      PasskeyAnswer a;
      a.route = cand.name;
      a.depth = cfg.depths[d];
      a.needle_token = needle_at;
      a.key = keys[d];
      a.answer_ids = backend.answer(rc, all.subspan(prefix), cfg.answer_tokens, tok, report);
      a.answer = tok.decode(a.answer_ids);
      a.retrieved = a.answer.find(a.key) != std::string::npos;
      if (rc.kind == route::RouteKind::exact) exact_answer = a.answer_ids;
      a.agrees_with_exact = a.answer_ids == exact_answer;
      a.compressed_page_fraction = report.compressed_fraction();
      say(fmt::format("depth {:.2f}: {:10s} answer '{}' -> {}{}", a.depth, a.route, a.answer,
                      a.retrieved ? "retrieved" : "missed", a.agrees_with_exact ? "" : " (differs from exact)"));
      result.answers.push_back(std::move(a));
    }
  }
  return result;
}

}  // namespace activekv::eval
