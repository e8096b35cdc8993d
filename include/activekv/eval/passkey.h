// The long-range check of issue 11 part 3: a passkey retrieval test.
//
// A random five-digit passkey (drawn from `seed`, one per depth) is planted at
// a fraction `depth` of a long prompt of repeated filler sentences:
//
//   [BOS] <intro> <filler> x k  <needle: "The pass key is K. Remember it. K is
//   the pass key.">  <filler> x (R - k)  <question: "What is the pass key? The
//   pass key is">
//
// R fillers make the prompt as long as it can be with the answer still inside
// `context` tokens. Pieces are tokenized one by one and concatenated, so the
// length is exact and the needle's token position is known.
//
// Per depth: everything before the question is prefilled exactly and every full
// page is converted (what a long prompt leaves behind, as in `activekv eval`);
// then, per route (exact first), the question runs along the route and
// `answer_tokens` tokens are decoded greedily along it (stopping at an
// end-of-generation token). Reported per depth and route: the answer, whether it
// contains the key (retrieval) and whether its tokens equal the exact route's
// (agreement with the exact tier).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "activekv/eval/quality_eval.h"
#include "activekv/model/llama_model.h"
#include "activekv/route/route.h"
#include "activekv/tokenizer/tokenizer.h"

namespace activekv::eval {

struct PasskeyConfig {
  int context = 32768;                      ///< prompt + answer tokens at most
  std::vector<double> depths{0.1, 0.5, 0.9};  ///< needle position, fraction of the fillers before it, in [0, 1]
  uint64_t seed = 1;                        ///< draws the keys (std::mt19937_64)
  int answer_tokens = 10;                   ///< greedy tokens per answer
  int page_size = 1024;
  int tile_pages = 32;
  std::vector<route::RouteCandidate> routes{default_candidates()};  ///< besides exact
};

/// One route's answer at one depth.
struct PasskeyAnswer {
  std::string route;         ///< "exact", "lossless13", ...
  double depth = 0;          ///< as configured
  int64_t needle_token = 0;  ///< position of the needle's first token in the prompt
  std::string key;           ///< the planted passkey, e.g. "48213"
  std::vector<int32_t> answer_ids;
  std::string answer;        ///< decoded answer_ids
  bool retrieved = false;    ///< answer contains key
  bool agrees_with_exact = false;  ///< answer_ids == the exact route's at this depth (true for exact)
  double compressed_page_fraction = 0;  ///< of the history pages the answer's steps read, the share read compressed
};

struct PasskeyResult {
  int64_t prompt_tokens = 0;  ///< per depth (all depths have the same length)
  std::vector<PasskeyAnswer> answers;  ///< per depth: exact first, then cfg.routes
  /// Fraction of depths whose answer along `route` contains the key / equals exact's.
  double retrieval_rate(const std::string& route) const;
  double agreement_rate(const std::string& route) const;
};

/// The passkey prompt's token ids and its needle's first position, for one
/// key and depth (exposed for tests). Throws InvalidArgument if `context` is
/// too short for the intro, needle, question and answer, or depth is outside [0, 1].
std::vector<int32_t> passkey_prompt(const Tokenizer& tok, const std::string& key, double depth, int context,
                                    int answer_tokens, int64_t* needle_token = nullptr);

/// The five-digit keys for `n` depths under `seed` (deterministic).
std::vector<std::string> passkey_keys(uint64_t seed, size_t n);

/// The model backend of run_passkey: the CPU forward (cpu_passkey_model) or
/// the GPU runtime (eval/gpu_eval.h).
class PasskeyModel {
 public:
  virtual ~PasskeyModel() = default;
  /// Starts a depth: `prefix` = the prompt before the question, prefilled
  /// exactly with every full page converted before any answer reads it.
  virtual void begin_prompt(std::span<const int32_t> prefix) = 0;
  /// Runs `question` after the prefix along route `rc`, then decodes up to
  /// `n` tokens greedily along it, stopping after an end-of-generation
  /// token; adds the pages the answer's steps read to `read`.
  virtual std::vector<int32_t> answer(const route::RouteConfig& rc, std::span<const int32_t> question, int n,
                                      const Tokenizer& tok, route::RouteReport& read) = 0;
};

/// The CPU backend: `m` over a host page store sized for `cfg`; the
/// prefix's history is shared by the routes of a depth.
std::unique_ptr<PasskeyModel> cpu_passkey_model(model::LlamaModel& m, const PasskeyConfig& cfg);

/// Runs the check with `backend`. Throws InvalidArgument for inconsistent
/// sizes (context, answer_tokens, page size), a depth outside [0, 1], or no depths.
PasskeyResult run_passkey(PasskeyModel& backend, const Tokenizer& tok, const PasskeyConfig& cfg,
                          const Progress& progress);
/// The same with the CPU backend.
PasskeyResult run_passkey(model::LlamaModel& m, const Tokenizer& tok, const PasskeyConfig& cfg,
                          const Progress& progress);

}  // namespace activekv::eval
