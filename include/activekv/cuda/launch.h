// Process-wide launch settings of the CUDA backend's decode-step kernels.
#pragma once

namespace activekv::cuda {

/// Programmatic dependent launch (PDL; compute capability 9.0+, CUDA 12.3+
/// inside captured graphs): the decode step's kernels -- RMSNorm, RoPE, the
/// SwiGLU and activation quantisers, the block-type matvecs, the K/V write,
/// the bf16 split attention and its merge -- are launched with
/// cudaLaunchAttributeProgrammaticStreamSerialization, so that each may start
/// while the kernel before it in the stream drains. Every such kernel calls
/// griddepcontrol.wait before it reads anything an earlier kernel wrote (and
/// before any write), then griddepcontrol.launch_dependents; a matvec and
/// RMSNorm first issue the loads of their own weights (read-only during
/// decode: a weight must not be written by the kernel just before), which is
/// where the overlap pays: the small kernels of a layer (norm, RoPE,
/// attention at short depth) fill few SMs while the next matrix starts
/// streaming. Results are bitwise the same on or off (the arithmetic and
/// its order do not change: tests/cuda/test_runtime.cpp holds it).
/// On by default; the process starts with it off if the environment has
/// ACTIVEKV_PDL=0 (or off/false/no). programmatic_launch() is false, whatever
/// was set, where it cannot run: a build for an architecture below sm_90
/// (whose kernels would not wait), or a CUDA runtime or driver older than
/// 12.3. Process-wide: set it before launching, not while other threads
/// launch (as set_block_matvec_kernel).
void set_programmatic_launch(bool on);
bool programmatic_launch();

}  // namespace activekv::cuda
