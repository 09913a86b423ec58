// apps/serve_memory.hpp — what `corolla serve --max-memory` holds: the
// blocks that fit, each counted with its weights and the KV cache for
// --cache-tokens, and the cache the rest of the budget then gives them
// (schedule/block_selection.hpp: blocks_that_fit, cache_tokens_that_fit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kernels/tensor.hpp"
#include "kernels/weight_format.hpp"
#include "model/config.hpp"
#include "schedule/block_selection.hpp"

namespace corolla::app {

/// The serve flags the plan reads.
struct serve_memory_flags {
  std::string max_memory;          ///< --max-memory: a size or "auto" (empty: no budget)
  std::string device;              ///< --device, where "auto" reads its free memory
  bool keep_f32 = false;           ///< --keep-f32-weights
  std::int64_t cache_tokens = 0;   ///< --cache-tokens: the least a block needs room for
};

/// The budget and the blocks it holds. Each block counts its weights (the
/// inference copies, and the f32 parameters where they are kept,
/// model/block.hpp served_block_bytes) and its share of the KV cache for
/// --cache-tokens, at most the model's blocks. Without the f32 parameters,
/// one block of them is set aside first: a block loads as f32 before it is
/// converted, and a fine-tuning request widens one block back to f32 while
/// it runs.
struct memory_plan {
  swarm::memory_budget budget;
  std::size_t kv_bytes_per_token = 0;  ///< one token's keys and values in one block
  int blocks = 0;
};

/// `available` bytes as a server with `weights` counts them: each block its
/// served weights (with the f32 parameters when `keep_f32`; f32 weights are
/// the parameters) and `cache_bytes_per_block`, and one f32 block set aside
/// when the parameters are not kept. What serve plans with, and what
/// bench serve sizes its cache by.
swarm::memory_budget served_memory_budget(std::uint64_t available, const model_config& cfg, weight_format weights,
                                          bool keep_f32, std::uint64_t cache_bytes_per_block);

/// The plan for flags.max_memory (logged). Throws std::invalid_argument for
/// a size that does not parse and when not even one block fits, naming
/// what one needs.
memory_plan plan_memory(const serve_memory_flags& flags, const model_config& cfg, weight_format weights, dtype kv);

/// Without --max-memory: throws std::invalid_argument, naming --cache-tokens,
/// when the KV cache it asks for `blocks` blocks is more than the device's
/// whole memory (it could never be allocated; better said before the
/// server announces itself than by the allocator after).
void check_cache_tokens(const serve_memory_flags& flags, const model_config& cfg, int blocks, dtype kv);

/// The KV cache tokens a span of `blocks` blocks gets: with a plan, all the
/// budget leaves after their weights (at least --cache-tokens, in whole
/// pages of `page_tokens`); else --cache-tokens.
std::int64_t cache_tokens_for(const serve_memory_flags& flags, const std::optional<memory_plan>& plan, int blocks,
                              int page_tokens);

}  // namespace corolla::app
