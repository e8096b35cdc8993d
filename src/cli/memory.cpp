#include "memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "activekv/kv/codec.h"
#include "activekv/kv/codec_lossless13.h"

namespace activekv::cli {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

uint64_t saturating_mul(uint64_t a, uint64_t b) { return b != 0 && a > kMax / b ? kMax : a * b; }
uint64_t saturating_add(uint64_t a, uint64_t b) { return a > kMax - b ? kMax : a + b; }

uint64_t pages_per_layer(const kv::KvShape& shape, int64_t n_tokens) {
  return (uint64_t(std::max<int64_t>(n_tokens, 0)) + uint64_t(shape.page_size) - 1) / uint64_t(shape.page_size);
}

const char* const kSource = "MemAvailable in /proc/meminfo";

}  // namespace

uint64_t available_memory_bytes() { return kv::host_memory_available(); }

std::string describe_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) v /= 1024.0, ++u;
  if (u == 0) return fmt::format("{} bytes", bytes);
  return fmt::format("{:.2f} {} ({} bytes)", v, units[u], bytes);
}

void require_memory(const std::string& what, uint64_t bytes, uint64_t available) {
  if (available == 0 || bytes <= available) return;
  throw Error(fmt::format("not enough memory for {}: {} asked, {} available ({})", what, describe_bytes(bytes),
                          describe_bytes(available), kSource));
}

Error allocation_failed(const std::string& what, uint64_t bytes) {
  return Error(fmt::format("out of memory allocating {}: {} asked, {} available ({}; a process limit such as "
                           "ulimit -v can be lower)", what, describe_bytes(bytes),
                           describe_bytes(available_memory_bytes()), kSource));
}

uint64_t cpu_weight_bytes(const gguf::File& f) {
  const model::WeightFormat format = model::weight_format_from_env();
  uint64_t total = 0;
  for (const auto& t : f.tensors()) {
    // n_elements * 4 saturates rather than wraps for a hostile file (it is checked again at load).
    const uint64_t b = t.n_elements > UINT64_MAX / 4 ? UINT64_MAX : model::cpu_tensor_bytes(t, format);
    total = saturating_add(total, b);
  }
  return total;
}

uint64_t page_store_bytes(const kv::KvShape& shape, int64_t n_tokens) {
  return saturating_mul(saturating_mul(pages_per_layer(shape, n_tokens), uint64_t(shape.n_layers)), shape.page_bytes());
}

uint64_t routed_history_bytes(const kv::KvShape& shape, route::RouteKind kind, int64_t n_tokens) {
  uint64_t encoded = 0;  // one encoded page's slot: lossless13 at its largest (every plane raw)
  if (kind != route::RouteKind::exact)
    encoded = route::compressed_format(kind) == route::ReadFormat::lossless13
                  ? kv::lossless13_raw_page_bytes(shape)
                  : kv::encoded_page_bytes(kv::CodecFormat::int8s, shape);
  const uint64_t pages = saturating_mul(pages_per_layer(shape, n_tokens), uint64_t(shape.n_layers));
  return saturating_add(page_store_bytes(shape, n_tokens), saturating_mul(pages, encoded));
}

void require_page_store(const kv::KvShape& shape, int64_t n_tokens) {
  require_memory(fmt::format("the KV page store of a {}-token context ({} pages x {} layers x {} bytes of {})",
                             n_tokens, pages_per_layer(shape, n_tokens), shape.n_layers, shape.page_bytes(), kv::format_name(shape.format)),
                 page_store_bytes(shape, n_tokens));
}

}  // namespace activekv::cli
