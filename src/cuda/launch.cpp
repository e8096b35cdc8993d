// The process-wide launch settings of activekv/cuda/launch.h.
#include "activekv/cuda/launch.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace activekv::cuda {
namespace {

// ACTIVEKV_PDL_BUILD (src/cuda/CMakeLists.txt): 0 when the build targets an
// architecture below sm_90, whose code would compile pdl::begin() to nothing
// -- launched with the attribute on a Hopper GPU (PTX JIT-compiled there), a
// kernel would not wait for the one before it.
#ifndef ACTIVEKV_PDL_BUILD
#define ACTIVEKV_PDL_BUILD 0
#endif

/// ACTIVEKV_PDL: 0/off/false/no turn it off, 1/on/true/yes (or unset) leave it on.
bool initial_pdl() {
  const char* e = std::getenv("ACTIVEKV_PDL");
  if (e == nullptr) return true;
  for (const char* off : {"0", "off", "false", "no"})
    if (std::strcmp(e, off) == 0) return false;
  for (const char* on : {"1", "on", "true", "yes"})
    if (std::strcmp(e, on) == 0) return true;
  std::fprintf(stderr, "activekv: ACTIVEKV_PDL='%s' is not 0/off or 1/on: programmatic dependent launch stays on\n", e);
  return true;
}
std::atomic<bool> g_pdl{initial_pdl()};

/// The build and the driver can run it: programmatic edges in captured
/// graphs need CUDA 12.3 (runtime and driver).
bool supported() {
  static const bool ok = [] {
    if (!ACTIVEKV_PDL_BUILD || CUDART_VERSION < 12030) return false;
    int driver = 0;
    return cudaDriverGetVersion(&driver) == cudaSuccess && driver >= 12030;
  }();
  return ok;
}

}  // namespace

void set_programmatic_launch(bool on) { g_pdl.store(on, std::memory_order_relaxed); }
bool programmatic_launch() { return g_pdl.load(std::memory_order_relaxed) && supported(); }

}  // namespace activekv::cuda
