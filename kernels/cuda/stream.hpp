// kernels/cuda/stream.hpp — the two names every launcher header needs,
// without the CUDA headers: the stream type and the storage element type of
// floating-point tensors. Host-only.
#pragma once

// cudaStream_t is `struct CUstream_st*`; declaring the struct keeps
// <cuda_runtime.h> out of the headers the C++20 side includes.
struct CUstream_st;

namespace corolla::cuda {

/// A CUDA stream (cudaStream_t).
using stream_t = CUstream_st*;

/// Storage type of a floating-point tensor; kernels compute in f32.
enum class elem { f32, bf16, f16 };

}  // namespace corolla::cuda
