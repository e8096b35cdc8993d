// The random numbers of token sampling, one definition for the CPU Sampler
// (activekv/model/sampler.h) and the GPU sampler (activekv/cuda/sampling.h),
// so both pick the same token for the same seed.
//
// Counter-based: draw number `draw` of seed `seed` is output number `draw`
// (0-based) of SplitMix64 started at state `seed` (Steele, Lea, Flood 2014;
// the reference splitmix64.c), i.e. a pure function of (seed, draw). Nothing
// is carried from one draw to the next, so a GPU kernel needs only the two
// integers, and a sampler's k-th call uses draw index k on either side.
//
// Plain C++17 (host) or CUDA (host and device): no std:: facilities needed.
#pragma once

#include <cstdint>

#ifndef AKV_HOST_DEVICE
#if defined(__CUDACC__)
#define AKV_HOST_DEVICE __host__ __device__
#else
#define AKV_HOST_DEVICE
#endif
#endif

namespace activekv::model {

/// Output number `draw` (0-based) of SplitMix64 seeded with `seed`: 64 random
/// bits. E.g. seed 1234567 gives 6457827717110365317, 3203168211198807973, ...
AKV_HOST_DEVICE inline uint64_t sample_bits(uint64_t seed, uint64_t draw) {
  uint64_t z = seed + (draw + 1) * 0x9e3779b97f4a7c15ull;  // unsigned: wraps mod 2^64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Uniform double in [0, 1): the top 53 bits of sample_bits() times 2^-53
/// (exact: every value is a multiple of 2^-53).
AKV_HOST_DEVICE inline double sample_uniform(uint64_t seed, uint64_t draw) {
  return double(sample_bits(seed, draw) >> 11) * 0x1.0p-53;
}

}  // namespace activekv::model
