// kernels/cuda/block_smem.cuh — COROLLA_BLOCK_SMEM(name): declares the
// block's dynamic shared memory as `unsigned char name[]`, 128-byte
// aligned. The CUDA emulation of tests/cuda_emulated/ defines it first, to
// a fresh NaN-filled buffer per block.
#pragma once

#ifndef COROLLA_BLOCK_SMEM
#define COROLLA_BLOCK_SMEM(name) extern __shared__ __align__(128) unsigned char name[]
#endif
