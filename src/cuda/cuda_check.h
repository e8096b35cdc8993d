// Internal to the CUDA backend and the GPU bench: AKV_CUDA(call) runs a CUDA
// runtime call and throws CudaError naming the call and the CUDA error when
// it fails (check_cuda of decode_attention.h).
#pragma once

#include "activekv/cuda/decode_attention.h"

#define AKV_CUDA(call) ::activekv::cuda::check_cuda(static_cast<int>(call), #call)
