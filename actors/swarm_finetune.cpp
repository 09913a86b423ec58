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
  span_batch b{.batch = batch_,
               .seq = seq_,
               .with_prompts = prompts_.defined(),
               .first = h.hop.start,
               .last = h.hop.end,
               .with_margins = margins,
               .adapter = client_.adapter_name()};
  if (prompts_.defined()) tensors.push_back(prompts_.slice(h.hop.start, h.hop.end));
  if (adapter_) {
    // The client's adapter goes with every request: the servers keep nothing.
    b.lora = adapter_->config();
    const std::int64_t per_block = adapter_->block_numel();
    tensors.push_back(adapter_values_.slice(per_block * h.hop.start, per_block * h.hop.end));
  }
  m.body = encode_body(b);
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

/// Whether a backward's answer holds what was asked of hop [start, end): the
/// input gradient of g's shape, the prompts' [blocks, P, D] gradient when
/// `prompts` is defined, and `lora` gradient values of the adapter (0: none).
bool backward_fits(const remote_message& r, const Tensor& g, const Tensor& prompts, int start, int end,
                   std::int64_t lora) {
  const std::size_t want = 1 + (prompts.defined() ? 1 : 0) + (lora > 0 ? 1 : 0);
  if (r.tensors.size() != want || r.tensors[0].shape() != g.shape()) return false;
  if (prompts.defined() && r.tensors[1].shape() != shape_t{end - start, prompts.dim(1), prompts.dim(2)}) return false;
  if (lora > 0 && r.tensors.back().shape() != shape_t{lora}) return false;
  return std::all_of(r.tensors.begin(), r.tensors.end(), [](const Tensor& t) { return t.type() == dtype::f32; });
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

Tensor swarm_span_runner::forward(const Tensor& hidden, int batch, int seq, const Tensor& deep_prompts,
                                  lora_adapter* adapter) {
  if (!deep_prompts.defined() && !adapter) throw std::invalid_argument("a forward needs prompts or an adapter to tune");
  const int n_blocks = deep_prompts.defined() ? static_cast<int>(deep_prompts.dim(0)) : adapter->n_layers();
  client_.expect_shape(n_blocks, static_cast<int>(hidden.dim(1)));
  if (!client_.refreshed())
    if (auto e = client_.refresh()) throw std::runtime_error(error_message(e));
  batch_ = batch;
  seq_ = seq;
  prompts_ = deep_prompts;
  adapter_ = adapter;
  // Laid out once a step: every request of it (retries and spot checks too)
  // carries a slice.
  adapter_values_ = adapter ? adapter->span_values(0, n_blocks) : Tensor();
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
  if (prompts_.defined()) out.grad_prompts = Tensor::empty(prompts_.shape());
  // The adapter's gradient values, block after block (lora_adapter::span_values).
  const std::int64_t per_block = adapter_ ? adapter_->block_numel() : 0;
  if (adapter_) out.grad_lora = Tensor::empty({per_block * adapter_->n_layers()});
  Tensor g = grad_output;
  for (std::size_t i = hops_.size(); i-- > 0;) {
    for (int attempt = 0;; ++attempt) {
      const hop_state& h = hops_[i];
      const std::int64_t lora = per_block * (h.hop.end - h.hop.start);
      const auto fits = [&](const caf::expected<remote_message>& r) {
        return r && backward_fits(*r, g, prompts_, h.hop.start, h.hop.end, lora);
      };
      auto r = call(h, span_request::backward, {h.input, g});
      caf::error e;
      if (fits(r)) {
        // Spot check: every gradient against another server's backward.
        bool right = true;
        if (client_.should_spot_check(h.hop.server))
          right = client_.spot_check(h.hop, spot_check_rows(r->tensors), [&](const std::string& other) -> caf::expected<spot_opinion> {
            hop_state c{{other, h.hop.start, h.hop.end}, h.input};
            auto z = call(c, span_request::backward, {h.input, g});
            if (!z) return z.error();
            if (!fits(z)) return make_error(errc::bad_message, "a backward answered with tensors of other shapes");
            return spot_opinion{spot_check_rows(z->tensors), {}};  // gradients: no routing margins
          });
        if (right) {
          if (prompts_.defined()) out.grad_prompts.slice(h.hop.start, h.hop.end).copy_from(r->tensors[1]);
          if (adapter_) out.grad_lora.slice(per_block * h.hop.start, per_block * h.hop.end).copy_from(r->tensors.back());
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

Tensor spot_check_rows(const std::vector<Tensor>& answer) {
  const std::int64_t D = answer.at(0).dim(1);
  std::int64_t rows = 0;
  for (const Tensor& t : answer) rows += (t.numel() + D - 1) / D;
  Tensor out = Tensor::zeros({rows, D});
  float* dst = out.data<float>();
  for (const Tensor& t : answer) {  // f32 (backward_fits), contiguous
    std::copy_n(t.data<float>(), t.numel(), dst);
    dst += (t.numel() + D - 1) / D * D;  // the next starts a row of its own
  }
  return out;
}

}  // namespace corolla
