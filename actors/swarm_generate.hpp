// actors/swarm_generate.hpp — text generation with the blocks on a swarm:
// the client embeds and samples, the servers (through a swarm_client
// session) run every block.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "actors/swarm_client.hpp"
#include "model/generator.hpp"
#include "model/head.hpp"

namespace corolla {

/// What swarm_generate reports besides the tokens.
struct swarm_generation {
  generation_result result;
  std::vector<swarm::route_hop> route;  ///< the chain at the end
  int failovers = 0;                    ///< failures recovered on the way
  std::uint64_t pushed_hops = 0;        ///< hop inputs pushed server to server
  std::uint64_t posted_steps = 0;       ///< steps only the last hop answered
  spot_check_stats spot_checks;         ///< the client's spot checks so far
};

/// Generates through the swarm: the client embeds and samples with `h`
/// (embeddings, final norm, LM head), the servers run every block. Same
/// loop, validation and stop rules as local generation (generate_tokens),
/// so greedy output equals the local one. With `deep_prompts` (f32
/// [n_layers, P, D], what `corolla finetune` saves) the servers add them
/// over a prefix of P positions, as generator::set_deep_prompts does
/// locally, and failover replays the prefix too. Throws model_error for a
/// bad request and std::runtime_error when the swarm fails for good.
swarm_generation swarm_generate(swarm_client& client, head& h, std::span<const std::int32_t> prompt,
                                const generation_params& p, const token_callback& on_token = {},
                                const Tensor& deep_prompts = {});

}  // namespace corolla
