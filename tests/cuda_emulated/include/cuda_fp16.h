// tests/cuda_emulated/include/cuda_fp16.h — stands in for the CUDA header of this
// name when kernels are compiled as host C++: cuda_emulation.hpp defines
// what they use.
#pragma once
