// Memory checks of the CLI: a model or a history that does not fit in host
// memory is refused with one line naming what, how much it asks and how much
// there is -- before the allocation where the size is known in advance, and
// by turning std::bad_alloc into that line where it is not.
#pragma once

#include <cstdint>
#include <new>
#include <string>

#include "activekv/core/error.h"
#include "activekv/gguf/gguf.h"
#include "activekv/kv/page_store.h"
#include "activekv/model/weights.h"
#include "activekv/route/route.h"

namespace activekv::cli {

/// MemAvailable of /proc/meminfo, bytes: what the kernel estimates can be
/// allocated without swapping. 0 when it cannot be read (checks then pass).
uint64_t available_memory_bytes();

/// "1.50 GiB (1610612736 bytes)": binary units for reading, the exact count for checking.
std::string describe_bytes(uint64_t bytes);

/// Throws Error "not enough memory for <what>: <bytes> asked, <available>
/// available (MemAvailable in /proc/meminfo)" if bytes > available; available
/// 0 means unknown (no check).
void require_memory(const std::string& what, uint64_t bytes, uint64_t available = available_memory_bytes());

/// The Error for an allocation of `bytes` for `what` that threw std::bad_alloc:
/// "out of memory allocating <what>: <bytes> asked, <MemAvailable now> available ...".
Error allocation_failed(const std::string& what, uint64_t bytes);

/// Bytes of a model's weights as LlamaModel holds them (model/weights.h):
/// the blocks of Q4_0/Q4_1/Q8_0 matrices, 4 per element of every other
/// tensor (all of them with ACTIVEKV_CPU_WEIGHTS=f32). Saturates instead of
/// overflowing. Throws InvalidArgument for a bad ACTIVEKV_CPU_WEIGHTS.
uint64_t cpu_weight_bytes(const gguf::File& f);

/// Bytes of the page store for `n_tokens` tokens: whole pages of every layer.
/// Saturates instead of overflowing.
uint64_t page_store_bytes(const kv::KvShape& shape, int64_t n_tokens);

/// Bytes one history of `n_tokens` takes as the GPU runtime holds it: the
/// bf16 page store (page_store_bytes) and room for the route's encoded copy
/// of every page (published as pages fill; none for the exact route). Host
/// memory with any placement; the same again on the GPU with gpu placement
/// (the runtime's HistoryView sizes its resident history so).
uint64_t routed_history_bytes(const kv::KvShape& shape, route::RouteKind kind, int64_t n_tokens);

/// Checks the page store of `n_tokens` fits (require_memory), naming -c,
/// the page count and the page size in the message.
void require_page_store(const kv::KvShape& shape, int64_t n_tokens);

/// Runs `load` (which builds the CPU weights of `model_path`) after checking
/// they fit; turns a std::bad_alloc from it into the same one-line Error.
template <typename Load>
auto load_weights_checked(const gguf::File& f, const std::string& model_path, Load&& load) {
  const uint64_t bytes = cpu_weight_bytes(f);
  const std::string what = "the weights of " + model_path +
                           (model::weight_format_from_env() == model::WeightFormat::f32
                                ? " dequantised to fp32 (ACTIVEKV_CPU_WEIGHTS=f32)"
                                : " (Q4_0/Q4_1/Q8_0 matrices as stored, the rest fp32)");
  require_memory(what, bytes);
  try {
    return load();
  } catch (const std::bad_alloc&) {
    throw allocation_failed(what, bytes);
  }
}

}  // namespace activekv::cli
