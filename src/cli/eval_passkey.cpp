// `activekv eval --passkey`. See eval_passkey.h.
#include "eval_passkey.h"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "activekv/core/text_file.h"
#include "provenance.h"
#include "stats.h"

namespace activekv::cli {

int run_passkey_eval(eval::PasskeyModel& backend, const Tokenizer& tok, const eval::PasskeyConfig& cfg,
                     const std::string& model_name, const std::string& json_out,
                     const std::function<nlohmann::json()>& where) {
  const std::string commit = git_commit();  // the tree this run started from
  const auto t0 = std::chrono::steady_clock::now();
  const eval::PasskeyResult r = eval::run_passkey(backend, tok, cfg, [&](const std::string& line) {
    fmt::print(stderr, "[passkey {:6.0f} s] {}\n", ms_since(t0) / 1000.0, line);
  });

  fmt::print("\npasskey, {} prompt tokens (context {}), seed {}\n{:>6s} {:>7s} {:12s} {:>9s} {:>6s} {:>11s}  answer\n",
             r.prompt_tokens, cfg.context, cfg.seed, "depth", "key", "route", "retrieved", "agrees", "compressed");
  nlohmann::json records = nlohmann::json::array();
  for (const eval::PasskeyAnswer& a : r.answers) {
    fmt::print("{:6.2f} {:>7s} {:12s} {:>9s} {:>6s} {:11.3f}  {:?}\n", a.depth, a.key, a.route, a.retrieved ? "yes" : "no",
               a.agrees_with_exact ? "yes" : "no", a.compressed_page_fraction, a.answer);
    records.push_back({{"depth", a.depth}, {"needle_token", a.needle_token}, {"key", a.key}, {"format", a.route},
                       {"answer", a.answer}, {"answer_ids", a.answer_ids}, {"retrieved", a.retrieved},
                       {"agrees_with_exact", a.agrees_with_exact},
                       {"compressed_page_fraction", a.compressed_page_fraction}});
  }
  nlohmann::json summary = nlohmann::json::array();
  std::vector<std::string> routes{"exact"};
  for (const route::RouteCandidate& c : cfg.routes) routes.push_back(c.name);
  for (const std::string& route : routes) {
    fmt::print("{:12s} retrieval {:.2f}, agreement with exact {:.2f} over {} depths\n", route, r.retrieval_rate(route),
               r.agreement_rate(route), cfg.depths.size());
    summary.push_back({{"format", route}, {"retrieval_rate", r.retrieval_rate(route)},
                       {"agreement_with_exact", r.agreement_rate(route)}});
  }
  nlohmann::json j{{"check", "passkey"}, {"model", model_name}, {"context", cfg.context},
                         {"prompt_tokens", r.prompt_tokens}, {"seed", cfg.seed}, {"depths", cfg.depths},
                         {"answer_tokens", cfg.answer_tokens}, {"page_size", cfg.page_size},
                         {"routes", routes}, {"commit", commit}, {"command", command_line()},
                         {"seconds", ms_since(t0) / 1000.0}, {"records", records}, {"summary", summary}};
  j.update(where());
  write_text_file(json_out, j.dump(2) + "\n", "eval --passkey --json output");
  fmt::print(stderr, "wrote {} ({} records) in {:.0f} s\n", json_out, records.size(), ms_since(t0) / 1000.0);
  return 0;
}

}  // namespace activekv::cli
