// Generation through the swarm (actors/swarm_generate.hpp).
#include "actors/swarm_generate.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/errors.hpp"
#include "model/error.hpp"

namespace corolla {

swarm_generation swarm_generate(swarm_client& client, head& h, std::span<const std::int32_t> prompt,
                                const generation_params& p, const token_callback& on_token,
                                const Tensor& deep_prompts, const swarm_prompt_sharing* sharing) {
  const model_config& cfg = h.config();
  client.expect_shape(cfg.n_layers, static_cast<int>(cfg.hidden_size));
  // Servers of another shape are left out by refresh().
  if (!client.refreshed())
    if (auto err = client.refresh()) throw std::runtime_error(error_message(err));
  // Deep prompts take positions [0, P): the tokens see a context shortened
  // by P and follow at P.. (as generator::set_deep_prompts).
  const std::int64_t P = deep_prompts.defined() ? deep_prompts.dim(1) : 0;
  if (P >= cfg.max_positions)
    throw model_error("deep prompts of " + std::to_string(P) + " positions leave no room in the model context of " +
                      std::to_string(cfg.max_positions));
  model_config token_cfg = cfg;
  token_cfg.max_positions = static_cast<int>(cfg.max_positions - P);
  const std::int64_t max_length = std::min<std::int64_t>(
      cfg.max_positions, P + static_cast<std::int64_t>(prompt.size()) + std::max(p.max_new_tokens, 0));
  if (P > 0) sharing = nullptr;  // another session's pages hold no deep prompts
  const auto prompt_n = static_cast<std::int64_t>(prompt.size());
  swarm_prefix start_on;
  if (sharing && !sharing->start.empty()) {
    start_on = sharing->start;
    start_on.tokens = std::min(start_on.tokens, prompt_n - 1);  // the last token's logits are the first sample's
  }
  std::unique_ptr<swarm_session> session;
  Tensor logits = Tensor::empty({1, cfg.vocab_size});
  swarm_generation out;
  out.result = generate_tokens(
      token_cfg, prompt, p,
      [&](std::span<const std::int32_t> ids, std::int64_t start) {
        if (!session) {
          auto s = client.open_session(max_length, deep_prompts, start_on);
          if (!s) throw std::runtime_error("cannot open a swarm session: " + error_message(s.error()));
          session = std::move(*s);
          out.shared_prompt_tokens = session->length();
          out.share_missed = session->share_missed();
        }
        // Prompt positions the session started with (another session's
        // pages) are not sent; a chunk they cover whole computes nothing
        // (its logits are not read: only the prompt's last chunk's are).
        if (start < session->length() && P == 0) {
          const std::int64_t skip = std::min<std::int64_t>(session->length() - start, ids.size());
          ids = ids.subspan(static_cast<std::size_t>(skip));
          start += skip;
          if (ids.empty())
            return std::span<const float>(logits.data<float>(), static_cast<std::size_t>(cfg.vocab_size));
        }
        const auto n = static_cast<std::int64_t>(ids.size());
        // The first step carries the prefix: P zero rows before the tokens.
        const std::int64_t lead = start == 0 ? P : 0, D = cfg.hidden_size;
        std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(P + start + i);
        Tensor x = Tensor::zeros({lead + n, D});
        Tensor tokens = x.slice(lead, lead + n);
        h.embed(Tensor::from_i32({ids.begin(), ids.end()}, {n}), Tensor::from_i32(pos, {n}), tokens);
        auto y = session->step(x, start == 0 ? 0 : P + start);
        if (!y) throw std::runtime_error("swarm step at position " + std::to_string(P + start) + " failed: " + error_message(y.error()));
        Tensor last = y->slice(lead + n - 1, lead + n);
        h.logits(last, logits, nullptr);
        if (sharing && sharing->on_prompt && start + n == prompt_n) sharing->on_prompt(session->prefix());
        return std::span<const float>(logits.data<float>(), static_cast<std::size_t>(cfg.vocab_size));
      },
      on_token);
  if (session) {
    out.route = session->hops();
    out.failovers = session->failovers();
    out.pushed_hops = session->pushed_hops();
    out.posted_steps = session->posted_steps();
  }
  if (sharing && sharing->on_end) {
    // Offered for later sessions (parked) or withdrawn, before the session
    // closes, so no one starts on it after.
    swarm_prefix held = session ? session->prefix() : swarm_prefix{};
    std::vector<std::int32_t> ids(prompt.begin(), prompt.end());
    ids.insert(ids.end(), out.result.tokens.begin(), out.result.tokens.end());
    ids.resize(static_cast<std::size_t>(std::clamp<std::int64_t>(held.tokens, 0, static_cast<std::int64_t>(ids.size()))));
    if (sharing->on_end(out, std::move(held), std::move(ids)) && session) session->close(true);
  }
  out.spot_checks = client.spot_checks();
  return out;
}

}  // namespace corolla
