// model/lora_factors.hpp — a LoRA adapter's factors beside frozen weights.
//
// A server that serves several adapters over one copy of the base weights
// (Petals' per-session adapters) cannot merge them into the weights: each
// session's rows take their own adapter in the same batch. The cached
// forwards (model/block.hpp) therefore add each adapted linear's low-rank
// term to its output, rows by rows:
//
//     y = x W^T (+ b)  then  y[rows] += s * (x[rows] A^T) B^T
//
// A [r, in], B [out, r], s the adapter's scaling (model/lora.hpp makes these
// from a lora_adapter: lora_adapter::factors). Two products of rank r per
// adapted weight and rows: a few percent of the weight's own product at the
// usual ranks, and exact whatever format the base weights are stored in
// (bf16, int8, nf4: the factors stay f32).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.hpp"

namespace corolla {

/// One adapted linear weight's factors: its output gets
/// scale * (x A^T) B^T added. An undefined `a`: the weight is not adapted.
struct lora_factors {
  Tensor a;  ///< [r, in], f32 on the block's device
  Tensor b;  ///< [out, r], f32 on the block's device
  float scale = 0.0f;

  bool defined() const { return a.defined(); }
};

/// One block's adapted linear weights by role (block_tensors' roles). GPT-2's
/// stacked c_attn gives q, k and v the same A and row slices of one B.
struct block_lora {
  lora_factors q, k, v, o, gate, up, down;
};

/// block_lora's roles in block order (q, k, v, o, gate, up, down).
inline constexpr lora_factors block_lora::*lora_roles[] = {&block_lora::q,  &block_lora::k,    &block_lora::v,
                                                           &block_lora::o,  &block_lora::gate, &block_lora::up,
                                                           &block_lora::down};

/// An adapter's factors for a run of consecutive blocks, indexed as the
/// stage serving them indexes its blocks (0 = its first block).
struct span_lora {
  std::vector<block_lora> blocks;
};

/// Block i's factors of `lora` (bounds checked), or null without an adapter.
inline const block_lora* block_lora_of(const span_lora* lora, std::size_t i) {
  return lora ? &lora->blocks.at(i) : nullptr;
}

/// Rows [row, row + rows) of a cached forward's input that take `lora`
/// (one session's rows in a batch); rows no segment covers take none.
struct lora_segment {
  std::int64_t row = 0;
  std::int64_t rows = 0;
  const block_lora* lora = nullptr;
};

}  // namespace corolla
