// Flags that several subcommands take, declared once so that each takes the
// same values and rejects the same ones (CLI11 validators: an out-of-range
// value is one line naming the flag and a non-zero exit, as any CLI11 parse error).
#pragma once

#include <cerrno>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace activekv::cli {

/// Largest token count a flag accepts (2^30): far beyond any model's context,
/// small enough that tokens x layers x bytes cannot overflow 64 bits.
inline constexpr int kMaxTokens = 1 << 30;

/// Every hardware thread: the default of -t.
inline int default_threads() { return int(std::max(1u, std::thread::hardware_concurrency())); }

/// `x` in its shortest form ("1024", "0.5", "3600000"), for messages.
template <class T>
std::string shortest(T x) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(x);
}

/// A value for a T option in [lo, hi]: first that it is a number -- a
/// whole number for integral T ("Value abc is not a whole number"), a
/// finite one for floating T ("Value abc is not a number") -- then the
/// range, worded as CLI::Range words it but with the bounds in their
/// shortest form ("Value 0 not in range 1 to 1024"). CLI::Range alone said
/// "Value abc not in range", and CLI::NonNegativeNumber printed DBL_MAX in
/// full. The help text keeps CLI::Range's description.
template <class T>
CLI::Validator in_range(T lo, T hi) {
  static_assert(std::is_arithmetic_v<T>);
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        if (v.empty()) return "the value is empty";
        if constexpr (std::is_integral_v<T>) {
          const size_t sign = v[0] == '-' || v[0] == '+' ? 1 : 0;
          long long w = 0;
          const char* digits = v.data() + (sign && v[0] == '+' ? 1 : 0);
          const auto [end, ec] = std::from_chars(digits, v.data() + v.size(), w);
          if (v.size() == sign || ec != std::errc() || end != v.data() + v.size())
            return "Value " + v + " is not a whole number";
          if (w < static_cast<long long>(lo) || w > static_cast<long long>(hi))
            return "Value " + v + " not in range " + shortest(lo) + " to " + shortest(hi);
        } else {
          char* end = nullptr;
          errno = 0;
          const double d = std::strtod(v.c_str(), &end);
          const bool overflow = errno == ERANGE && std::isinf(d);  // 1e999: a number, out of range
          if (end != v.c_str() + v.size() || (!std::isfinite(d) && !overflow)) return "Value " + v + " is not a number";
          if (overflow || d < static_cast<double>(lo) || d > static_cast<double>(hi))
            return "Value " + v + " not in range " + shortest(lo) + " to " + shortest(hi);
        }
        return {};
      },
      CLI::Range(lo, hi).get_description());
}

/// in_range(lo, hi) for a floating option, but a value past a bound says
/// which side (`below` or `above`, e.g. " is negative") instead of naming
/// bounds nobody types (DBL_MAX in full); `description` is the help text's.
inline CLI::Validator worded_range(double lo, double hi, std::string below, std::string above,
                                   std::string description) {
  return CLI::Validator(
      [=](std::string& v) -> std::string {
        std::string checked = v;
        const std::string e = in_range(lo, hi)(checked);
        if (e.empty() || e.find("not in range") == std::string::npos) return e;
        return "Value " + v + (std::strtod(v.c_str(), nullptr) < lo ? below : above);
      },
      std::move(description));
}

/// A value for a floating option that is a finite number >= 0 ("Value -1 is
/// negative", "Value 1e999 is too large"); the help text says NONNEGATIVE, as
/// CLI::NonNegativeNumber's.
inline CLI::Validator non_negative() {
  return worded_range(0.0, std::numeric_limits<double>::max(), " is negative", " is too large", "NONNEGATIVE");
}

/// A value for a floating option of type T that is a finite T ("Value inf
/// is not a number", "Value 1e39 is too large" for a float), checked as
/// the flag is parsed like every other flag value (exit 105), not after.
template <class T>
CLI::Validator finite_number() {
  static_assert(std::is_floating_point_v<T>);
  const double max = std::numeric_limits<T>::max();
  return worded_range(-max, max, " is too small", " is too large", "FINITE");
}

/// A probability above zero: a number in (0, 1] ("Value 0 not in range
/// (0, 1]"), e.g. top-p.
inline CLI::Validator above_zero_to_one() {
  const std::string out = " not in range (0, 1]";
  const CLI::Validator closed = worded_range(0.0, 1.0, out, out, "(0, 1]");
  return CLI::Validator(
      [closed, out](std::string& v) -> std::string {
        std::string checked = v;
        const std::string e = closed(checked);
        return e.empty() && std::strtod(v.c_str(), nullptr) == 0.0 ? "Value " + v + out : e;
      },
      "(0, 1]");
}

/// A path (or name) that is not empty: an empty value would otherwise read as
/// "not given" -- the default model, no JSON written -- without a word.
inline CLI::Validator non_empty() {
  return CLI::Validator([](std::string& v) -> std::string { return v.empty() ? "the value is empty" : ""; }, "");
}

/// A token or item count in [lo, kMaxTokens] (in_range).
inline CLI::Validator count_range(int lo) { return in_range(lo, kMaxTokens); }

/// A sampling seed: -1 (a random one, printed) or a whole number from 0 to
/// 2^63 - 1 (every printed seed). CLI11's own conversion saturated larger
/// values to 2^63 - 1 without a word.
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v == "-1") return {};
        long long x = 0;
        const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
        if (v.empty() || ec != std::errc() || end != v.data() + v.size() || x < 0)
          return "Value " + v + " is not -1 or a whole number from 0 to 9223372036854775807";
        return {};
      },
      "-1 or 0..2^63-1");
}

/// Token counts as digits with an optional k (x 1024) or m (x 1024^2):
/// "32k" -> 32768. Rewrites the value for the option's integer parse; any
/// other text is one line naming it (CLI::AsSizeValue took byte units --
/// "2kib", "1gb" -- for a token count).
inline CLI::Validator token_count() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        std::string digits = v;
        long long scale = 1;
        if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) scale = 1024;
        if (!digits.empty() && (digits.back() == 'm' || digits.back() == 'M')) scale = 1024 * 1024;
        if (scale != 1) digits.pop_back();
        if (digits.empty() || digits.size() > 12 || !std::all_of(digits.begin(), digits.end(), [](char c) {
              return c >= '0' && c <= '9';
            }))
          return "'" + v + "' is not a token count (digits, optionally k = 1024 or m = 1024^2: 32k)";
        v = std::to_string(std::stoll(digits) * scale);
        return {};
      },
      "TOKENS (k = 1024)");
}

/// `message` (a CLI11 error) with the option it starts with ("--n-depth: ...")
/// named by its short name too ("-d/--n-depth: ..."), looked up in the
/// subcommands parsed, deepest first, then `app`; unchanged otherwise.
inline std::string name_both(const CLI::App& app, std::string message) {
  std::vector<const CLI::App*> chain{&app};
  for (const CLI::App* a = &app;;) {
    const std::vector<CLI::App*> subs = a->get_subcommands();
    if (subs.empty()) break;
    a = subs.front();
    chain.push_back(a);
  }
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    for (const CLI::Option* o : (*it)->get_options()) {
      if (o->get_snames().empty() || o->get_lnames().empty()) continue;
      const std::string long_name = "--" + o->get_lnames().front();
      if (message.rfind(long_name + ":", 0) == 0) return "-" + o->get_snames().front() + "/" + message;
    }
  return message;
}

/// -t,--threads: CPU threads, 1..1024.
inline CLI::Option* add_threads_option(CLI::App& app, int& threads) {
  return app.add_option("-t,--threads", threads, "CPU threads")->capture_default_str()->check(in_range(1, 1024));
}

/// --page-size: tokens per KV page, 1..2^20.
inline CLI::Option* add_page_size_option(CLI::App& app, int& page_size) {
  return app.add_option("--page-size", page_size, "Tokens per KV page")->capture_default_str()
      ->check(in_range(1, 1 << 20));
}

/// --recent-pages: the hybrid route's full pages kept exact before the tail, 0..2^20.
inline CLI::Option* add_recent_pages_option(CLI::App& app, int& recent_pages) {
  return app.add_option("--recent-pages", recent_pages, "hybrid: full pages before the tail kept exact")
      ->capture_default_str()->check(in_range(0, 1 << 20));
}

/// --cuda-graphs auto|on|off: GPU decode steps with the history resident
/// (gpu placement) run as one CUDA graph each, the next one captured while
/// the GPU runs this one (runtime::RuntimeOptions::cuda_graphs, lookahead).
/// auto: on where it applies (--device cuda, one sequence), else off; on
/// where it cannot apply is an error.
inline CLI::Option* add_cuda_graphs_option(CLI::App& app, std::string& cuda_graphs) {
  return app.add_option("--cuda-graphs", cuda_graphs,
                        "GPU: run each decode step with --kv-placement gpu as one CUDA graph, captured while the "
                        "step before runs (on; auto: on where it applies) or kernel by kernel (off); the same "
                        "results either way. host placement and prefill are never captured")
      ->capture_default_str()->check(CLI::IsMember({"auto", "on", "off"}));
}

/// --cpu-share not given: auto where pages stream by default (placement auto
/// or partial), none with an explicit --kv-placement host (today's link-only
/// streaming: `--kv-placement host` alone keeps meaning what it meant).
constexpr double kCpuShareUnset = -2;

/// The runtime's cpu_share (runtime::RuntimeOptions::cpu_share: -1 auto) for
/// a --cpu-share value and a --kv-placement name.
inline double resolve_cpu_share(double cpu_share, const std::string& placement) {
  if (cpu_share != kCpuShareUnset) return cpu_share;
  return placement == "host" || placement == "gpu" ? 0.0 : -1.0;
}

/// --cpu-share F: with pages streamed (host or partial placement), the share
/// of each layer's pages, oldest first, that the host CPU attends in place
/// while the GPU streams the rest (co-attention; runtime::RuntimeOptions::cpu_share).
/// "auto" (the planner balances the link and the CPU from rates measured at
/// start: route/co_attention_plan.h) is stored as -1; not given: kCpuShareUnset
/// (resolve_cpu_share).
inline CLI::Option* add_cpu_share_option(CLI::App& app, double& cpu_share) {
  return app
      .add_option_function<std::string>(
          "--cpu-share",
          [&cpu_share](const std::string& v) {
            if (v == "auto") {
              cpu_share = -1;
              return;
            }
            char* end = nullptr;
            const double f = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != '\0' || !(f >= 0 && f < 1))
              throw CLI::ValidationError("--cpu-share", "'" + v + "' is neither auto nor a share in [0, 1)");
            cpu_share = f;
          },
          "GPU, host or partial placement: share of each layer's streamed history pages (oldest first) the host CPU "
          "attends in place while the GPU streams the rest (co-attention), in [0, 1), or auto (balanced from rates "
          "measured at start)")
      ->default_str("auto with --kv-placement auto|partial, 0 with host");
}

}  // namespace activekv::cli
