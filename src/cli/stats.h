// Small measurement helpers for CLI summaries.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

namespace activekv::cli {

/// Peak resident set size of this process, bytes (getrusage ru_maxrss).
uint64_t peak_rss_bytes();

/// The q-quantile (0..1) of `v` by nearest rank; 0 for an empty vector.
double quantile(std::vector<double> v, double q);

/// Milliseconds since `t0` on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace activekv::cli
