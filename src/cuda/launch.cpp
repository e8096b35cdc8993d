// The process-wide launch settings of activekv/cuda/launch.h.
#include "activekv/cuda/launch.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace activekv::cuda {
namespace {

bool initial_pdl() {
  const char* e = std::getenv("ACTIVEKV_PDL");
  return !(e != nullptr && std::strcmp(e, "0") == 0);
}
std::atomic<bool> g_pdl{initial_pdl()};

}  // namespace

void set_programmatic_launch(bool on) { g_pdl.store(on, std::memory_order_relaxed); }
bool programmatic_launch() { return g_pdl.load(std::memory_order_relaxed); }

}  // namespace activekv::cuda
