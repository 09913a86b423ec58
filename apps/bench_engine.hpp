// apps/bench_engine.hpp — a swarm server's engine decoding on its own (no
// actor, no wire), for the benches that measure it: corolla bench serve
// (the engine beside the server) and corolla bench lora-serve (sessions
// with adapters beside sessions without).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/span_engine.hpp"
#include "model/stage.hpp"
#include "model/transformer.hpp"

namespace corolla::app {

/// Every block of `model` as a server of `weights` holds it (`serve
/// --weights`): the f32 parameters for f32, else their inference copies
/// alone, `model` then released (its f32 parameters go with it).
stage served_blocks(std::optional<transformer>& model, weight_format weights, Backend& be);

/// Rows [n, d] of pseudo-random hidden states in [-1, 1) on the host.
Tensor random_rows(std::int64_t n, std::int64_t d, std::uint64_t seed);

/// `sessions` sessions straight on `e`: each opened (with adapters[s] when
/// `adapters` is not empty) and prefilled with `prompt`, two warm-up steps,
/// then `new_tokens` steps of `row` per session, as a server runs them (one
/// session alone: inference_step; several: one decode_batch per step).
/// Closes them again. Tokens/s. `tag` keeps the session ids of repeated
/// calls apart. Throws std::runtime_error naming a failed step.
double engine_decode_tokens_per_s(span_engine& e, int sessions, const Tensor& prompt, const Tensor& row,
                                  int new_tokens, const std::string& tag,
                                  const std::vector<std::string>& adapters = {});

}  // namespace corolla::app
