#include "actors/swarm_finetune.hpp"

#include <algorithm>
#include <stdexcept>

#include "actors/errors.hpp"
#include "actors/node.hpp"
#include "actors/swarm_wire.hpp"

namespace corolla {

swarm_span_runner::swarm_span_runner(swarm_client& client, std::uint64_t seed) : client_(client), rng_(seed) {}

std::vector<swarm::route_hop> swarm_span_runner::route() const {
  std::vector<swarm::route_hop> out;
  for (const auto& h : hops_) out.push_back(h.hop);
  return out;
}

caf::expected<remote_message> swarm_span_runner::call(const hop_state& h, const char* type, std::vector<Tensor> tensors,
                                                      bool margins) {
  remote_message m;
  m.type = type;
  m.body = encode_body(span_batch{.batch = batch_,
                                  .seq = seq_,
                                  .with_prompts = true,
                                  .first = h.hop.start,
                                  .last = h.hop.end,
                                  .with_margins = margins,
                                  .adapter = client_.adapter_name()});
  tensors.push_back(prompts_.slice(h.hop.start, h.hop.end));
  m.tensors = std::move(tensors);
  // A backward recomputes the forward: both grow with the rows.
  const auto timeout = client_.options().request_timeout * (1 + h.input.dim(0) / 256);
  return client_.runtime().request(h.hop.server, "span", std::move(m), timeout);
}

void swarm_span_runner::give_up(const hop_state& h, const char* what, const caf::error& e, int attempts) const {
  throw std::runtime_error(std::string(what) + " of blocks " + to_string(h.hop.span()) + " failed" +
                           (attempts > 1 ? " after " + std::to_string(attempts) + " attempts" : std::string()) + ": " +
                           error_message(e));
}

std::size_t swarm_span_runner::replace(std::size_t i, const caf::error& cause, int attempt) {
  const swarm::route_hop lost = hops_[i].hop;
  client_.event("fine-tuning: server " + lost.server + " failed on blocks " + to_string(lost.span()) + ": " +
                error_message(cause));
  std::set<std::string> excluded{lost.server};
  if (attempt > 0) {
    if (auto e = client_.back_off(attempt - 1)) give_up(hops_[i], "rerouting", e, attempt + 1);
  }
  auto r = client_.throughput_route(lost.start, lost.end, excluded, rng_);
  if (!r) r = client_.throughput_route(lost.start, lost.end, {}, rng_);  // the failed server is all there is
  if (!r) give_up(hops_[i], "rerouting", r.error(), attempt + 1);
  std::vector<hop_state> fresh;
  for (const auto& hop : r->hops) fresh.push_back({hop, Tensor()});
  fresh.front().input = hops_[i].input;
  hops_.erase(hops_.begin() + static_cast<std::ptrdiff_t>(i));
  hops_.insert(hops_.begin() + static_cast<std::ptrdiff_t>(i), fresh.begin(), fresh.end());
  ++failovers_;
  client_.event("fine-tuning: blocks " + to_string(lost.span()) + " now via " + swarm::to_string(*r));
  return fresh.size();
}

namespace {

/// A backward's answer as one [rows, D] tensor for a spot check: the input
/// gradient's rows, then the prompt gradients' [blocks * P] rows.
caf::expected<Tensor> backward_rows(caf::expected<remote_message> r, const Tensor& g, std::int64_t prompt_rows) {
  if (!r) return r.error();
  if (r->tensors.size() != 2 || r->tensors[0].shape() != g.shape() ||
      r->tensors[1].numel() != prompt_rows * g.dim(1))
    return make_error(errc::bad_message, "a backward answered with tensors of other shapes");
  Tensor rows = Tensor::empty({g.dim(0) + prompt_rows, g.dim(1)});
  rows.slice(0, g.dim(0)).copy_from(r->tensors[0]);
  rows.slice(g.dim(0), g.dim(0) + prompt_rows).copy_from(r->tensors[1].view({prompt_rows, g.dim(1)}));
  return rows;
}

caf::error wrong_output() {
  return error_from_wire("wrong_output", "a spot check's majority disagrees with its answer");
}

}  // namespace

std::pair<std::size_t, Tensor> swarm_span_runner::run_forward(std::size_t from, std::size_t to, Tensor x) {
  for (std::size_t i = from; i < to; ++i) {
    for (int attempt = 0;; ++attempt) {
      hops_[i].input = x;
      auto r = call(hops_[i], span_request::forward, {x});
      caf::error e;
      if (r && r->tensors.size() == 1 && r->tensors[0].shape() == x.shape()) {
        // Spot check: the same forward on another server holding the blocks.
        const swarm::route_hop hop = hops_[i].hop;
        if (!client_.should_spot_check(hop.server) ||
            client_.spot_check(
                hop, r->tensors[0],
                [&](const std::string& other) -> caf::expected<spot_opinion> {
                  hop_state h{{other, hop.start, hop.end}, x};
                  auto z = call(h, span_request::forward, {x}, true);
                  if (!z) return z.error();
                  return spot_opinion_of(std::move(*z), 0, x.dim(0));
                },
                Tensor(), static_cast<std::size_t>(seq_))) {
          x = std::move(r->tensors[0]);
          break;
        }
        e = wrong_output();
      } else {
        e = r ? make_error(errc::bad_message,
                           "server " + hops_[i].hop.server + " answered a forward with tensors of another shape")
              : r.error();
      }
      if (!is_recoverable(e) || attempt + 1 >= client_.options().max_failovers)
        give_up(hops_[i], "forward", e, attempt + 1);
      to += replace(i, e, attempt) - 1;
    }
  }
  return {to, std::move(x)};
}

Tensor swarm_span_runner::forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts) {
  const int n_blocks = static_cast<int>(deep_prompts.dim(0));
  client_.expect_shape(n_blocks, static_cast<int>(hidden.dim(1)));
  if (!client_.refreshed())
    if (auto e = client_.refresh()) throw std::runtime_error(error_message(e));
  batch_ = batch;
  seq_ = seq;
  prompts_ = deep_prompts;
  hops_.clear();
  auto r = client_.throughput_route(0, n_blocks, {}, rng_);
  if (!r) {  // servers that joined or came back since
    if (auto e = client_.refresh()) throw std::runtime_error(error_message(e));
    r = client_.throughput_route(0, n_blocks, {}, rng_);
    if (!r) throw std::runtime_error("no route over the model's blocks: " + error_message(r.error()));
  }
  for (const auto& hop : r->hops) hops_.push_back({hop, Tensor()});
  return run_forward(0, hops_.size(), hidden).second;
}

span_gradients swarm_span_runner::backward(const Tensor& grad_output) {
  if (hops_.empty()) throw std::runtime_error("backward without a forward");
  span_gradients out;
  out.grad_prompts = Tensor::empty(prompts_.shape());
  Tensor g = grad_output;
  for (std::size_t i = hops_.size(); i-- > 0;) {
    for (int attempt = 0;; ++attempt) {
      const hop_state& h = hops_[i];
      auto r = call(h, span_request::backward, {h.input, g});
      const std::int64_t blocks = h.hop.end - h.hop.start;
      caf::error e;
      if (r && r->tensors.size() == 2 && r->tensors[0].shape() == g.shape() &&
          r->tensors[1].shape() == shape_t{blocks, prompts_.dim(1), prompts_.dim(2)}) {
        // Spot check: both gradients against another server's backward.
        bool right = true;
        if (client_.should_spot_check(h.hop.server)) {
          const std::int64_t prompt_rows = blocks * prompts_.dim(1);
          auto mine = backward_rows(*r, g, prompt_rows);
          right = !mine || client_.spot_check(h.hop, *mine, [&](const std::string& other) -> caf::expected<spot_opinion> {
            hop_state c{{other, h.hop.start, h.hop.end}, h.input};
            auto rows = backward_rows(call(c, span_request::backward, {h.input, g}), g, prompt_rows);
            if (!rows) return rows.error();
            return spot_opinion{std::move(*rows), {}};  // gradients: no routing margins
          });
        }
        if (right) {
          out.grad_prompts.slice(h.hop.start, h.hop.end).copy_from(r->tensors[1]);
          g = std::move(r->tensors[0]);
          break;
        }
        e = wrong_output();
      } else {
        e = r ? make_error(errc::bad_message,
                           "server " + h.hop.server + " answered a backward with tensors of other shapes")
              : r.error();
      }
      if (!is_recoverable(e) || attempt + 1 >= client_.options().max_failovers) give_up(h, "backward", e, attempt + 1);
      // The replacement hops need their own inputs: a forward through all
      // of them but the last gives those; then the backward goes on from
      // the last of them.
      const std::size_t k = replace(i, e, attempt);
      auto [last, x] = run_forward(i, i + k - 1, hops_[i].input);
      hops_[last].input = std::move(x);
      i = last;
    }
  }
  out.grad_input = std::move(g);
  return out;
}

}  // namespace corolla
