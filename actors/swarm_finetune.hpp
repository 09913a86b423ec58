// actors/swarm_finetune.hpp — a prompt tuner's blocks on the swarm: stateless
// span.forward / span.backward through a max-throughput route (Petals'
// fine-tuning client).
//
// forward() draws a route over [0, n_blocks) (a random server per span,
// weighted by throughput) and sends each hop its input, its blocks' slice
// of the deep prompts and its blocks' part of the client's LoRA adapter
// (when tuned: SpanBatch.lora*), keeping every hop's input; backward() walks
// the same hops in reverse with the loss gradient and collects the input
// gradients and the prompts' and adapter's gradients. Nothing is stored on the servers,
// so recovering from a failed hop is rerouting its blocks (the failed
// server excluded for that attempt) and sending the same request again; a
// hop that fails in backward is replaced and its new hops' inputs are
// recomputed by a forward through them first. Retries back off as in
// inference (swarm_client_options: max_failovers, retry_backoff) and end
// with std::runtime_error naming the blocks and the last error.
//
// Blocking calls: use from a program's own thread, not from an actor.
#pragma once

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "actors/swarm_client.hpp"
#include "model/prompt_tuning.hpp"

namespace corolla {

class swarm_span_runner final : public span_runner {
 public:
  /// Routes through `client`'s servers (refreshed at the first forward);
  /// `seed` drives the route choices.
  swarm_span_runner(swarm_client& client, std::uint64_t seed = 0);

  Tensor forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts,
                 lora_adapter* adapter = nullptr) override;
  span_gradients backward(const Tensor& grad_output) override;

  /// The hops of the last forward (after any replacements).
  std::vector<swarm::route_hop> route() const;
  /// Failed requests recovered by rerouting so far.
  int failovers() const { return failovers_; }

 private:
  struct hop_state {
    swarm::route_hop hop;
    Tensor input;  ///< what this hop's forward got (its backward needs it)
  };
  /// Runs hops [from, to) forward from `x`, rerouting failed ones; returns
  /// the (possibly moved) end of the range and the last hop's output.
  std::pair<std::size_t, Tensor> run_forward(std::size_t from, std::size_t to, Tensor x);
  /// Replaces hops_[i] by a route over its blocks; returns how many hops
  /// took its place. Throws when no server is left for them.
  std::size_t replace(std::size_t i, const caf::error& cause, int attempt);
  /// With `margins`, a forward also answers each row's routing margin (a
  /// second tensor; spot checks).
  caf::expected<remote_message> call(const hop_state& h, const char* type, std::vector<Tensor> tensors,
                                     bool margins = false);
  [[noreturn]] void give_up(const hop_state& h, const char* what, const caf::error& e, int attempts) const;

  swarm_client& client_;
  std::mt19937_64 rng_;
  std::vector<hop_state> hops_;
  Tensor prompts_;
  lora_adapter* adapter_ = nullptr;  ///< the client's, sent with each request (its blocks' part)
  Tensor adapter_values_;            ///< its values at this step's forward (lora_adapter::span_values)
  int batch_ = 0, seq_ = 0;
  int failovers_ = 0;
};

/// A backward's answer (f32 tensors, the first [rows, D]: the input
/// gradient; then the prompts' and the adapter's gradients, any shape) as
/// one [rows', D] tensor for a spot check's row-by-row comparison: each
/// tensor's values in rows of D, each tensor starting a row of its own (its
/// last row padded with zeros), so every gradient is compared, relative to
/// values of its own.
Tensor spot_check_rows(const std::vector<Tensor>& answer);

}  // namespace corolla
