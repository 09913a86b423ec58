// actors/swarm_generate.hpp — text generation with the blocks on a swarm:
// the client embeds and samples, the servers (through a swarm_client
// session) run every block.
#pragma once

#include <cstdint>
#include <functional>
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
  /// Prompt tokens the session started with on another session's pages
  /// (swarm_prompt_sharing::start), not computed.
  std::int64_t shared_prompt_tokens = 0;
  /// The start offered (swarm_prompt_sharing::start) gave nothing: its
  /// session is gone from its servers, or its route is no longer usable.
  bool share_missed = false;
};

/// How a generation's prompt meets other sessions of the same client node
/// (api/swarm_prefix_board.hpp): it may start on one's servers' pages, and
/// tells when its own prompt is on its servers.
struct swarm_prompt_sharing {
  /// Start on these: positions [0, start.tokens) of the prompt (at most all
  /// of it but the last token) are not computed. Empty: compute them all.
  swarm_prefix start;
  /// Called once the prompt's last step is done, with what the session
  /// holds then (its prompt's positions).
  std::function<void(swarm_prefix)> on_prompt;
  /// Called when generation ends, before the session closes, with the
  /// generation so far, what its session holds then (empty when nothing can
  /// be offered) and the token ids of
  /// those positions (the prompt and the tokens fed back); true parks the
  /// session (swarm_session::close(true): its pages stay for later
  /// sessions of this node to start on) instead of closing it. Unset: closed.
  std::function<bool(const swarm_generation&, swarm_prefix, std::vector<std::int32_t>)> on_end;
};

/// Generates through the swarm: the client embeds and samples with `h`
/// (embeddings, final norm, LM head), the servers run every block. Same
/// loop, validation and stop rules as local generation (generate_tokens),
/// so greedy output equals the local one. With `deep_prompts` (f32
/// [n_layers, P, D], what `corolla finetune` saves) the servers add them
/// over a prefix of P positions, as generator::set_deep_prompts does
/// locally, and failover replays the prefix too. With `sharing` (no deep
/// prompts) the prompt may start on another session's pages and its own are
/// offered to others. Throws model_error for a bad request and
/// std::runtime_error when the swarm fails for good.
swarm_generation swarm_generate(swarm_client& client, head& h, std::span<const std::int32_t> prompt,
                                const generation_params& p, const token_callback& on_token = {},
                                const Tensor& deep_prompts = {}, const swarm_prompt_sharing* sharing = nullptr);

}  // namespace corolla
