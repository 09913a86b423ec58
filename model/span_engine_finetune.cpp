// model/span_engine_finetune.cpp — the stateless forward and backward a
// server runs for fine-tuning clients, with deep prompts.
//
// Deep prompts (Petals' deep prompt tuning): for block first()+i of the
// span, prompt i ([P, D]) is added to the hidden states of positions
// 0..P-1 of every sequence at that block's input:
//     u_i = x_i + pad(prompt_i),  x_{i+1} = block_i(u_i)
// so d prompt_i = sum over sequences of dL/du_i at those positions, and
// dL/dx_i = dL/du_i (the addition passes the gradient through).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "model/span_engine.hpp"

#include <optional>

#include "model/error.hpp"
#include "model/lora.hpp"

namespace corolla {
namespace {

span_error invalid(std::string message) {
  return {span_errc::invalid_argument, std::move(message)};
}

}  // namespace

span_expected<void> span_engine::check_forward(const Tensor& hidden, int batch, int seq,
                                               const Tensor& deep_prompts, int blocks) const {
  const model_config& cfg = config();
  const std::int64_t D = cfg.hidden_size;
  if (batch <= 0 || seq <= 0)
    return invalid("batch size and sequence length must be positive, got " +
                   std::to_string(batch) + " x " + std::to_string(seq));
  if (seq > cfg.max_positions)
    return invalid("sequence of " + std::to_string(seq) + " tokens exceeds the model context of " +
                   std::to_string(cfg.max_positions));
  const std::int64_t rows = static_cast<std::int64_t>(batch) * seq;
  if (rows > options_.max_forward_rows)
    return invalid(std::to_string(batch) + " x " + std::to_string(seq) + " = " +
                   std::to_string(rows) + " rows exceed this server's limit of " +
                   std::to_string(options_.max_forward_rows) + " rows per request");
  if (auto ok = check_hidden(hidden, "hidden states"); !ok) return ok;
  if (hidden.dim(0) != rows)
    return invalid("hidden states have " + std::to_string(hidden.dim(0)) + " rows, expected " +
                   std::to_string(batch) + " x " + std::to_string(seq) + " = " +
                   std::to_string(rows));
  if (deep_prompts.defined()) {
    const shape_t& s = deep_prompts.shape();
    const bool float_type = deep_prompts.type() == dtype::f32 ||
                            deep_prompts.type() == dtype::bf16 || deep_prompts.type() == dtype::f16;
    if (deep_prompts.dev().kind != device_kind::cpu || !float_type || s.size() != 3 ||
        s[0] != blocks || s[1] < 1 || s[1] > seq || s[2] != D)
      return invalid("deep prompts must be float [" + std::to_string(blocks) +
                     " blocks, P, " + std::to_string(D) + "] on the host with 1 <= P <= " +
                     std::to_string(seq) + " (the sequence length), got " +
                     dtype_name(deep_prompts.type()) + " " + shape_str(s) + " on " +
                     deep_prompts.dev().str());
  }
  return {};
}

/// Frees what a stateless request held (the stage's widened weights on an
/// inference-only stage) when it is done, however it ends.
struct span_engine::request_scope {
  span_engine& e;
  ~request_scope() { e.release_request_weights(); }
};

void span_engine::release_request_weights() { stage_.release_frozen_weights(); }

struct span_engine::request_lora {
  std::shared_ptr<const span_lora> held;  ///< a held adapter's factors
  std::optional<lora_adapter> carried;    ///< a client's, for the request's blocks only
  span_lora carried_factors;              ///< its factors at the span's block indices
  const span_lora* factors() const { return held ? held.get() : carried ? &carried_factors : nullptr; }
};

span_expected<std::unique_ptr<span_engine::request_lora>> span_engine::request_adapter(
    const std::string& name, const lora_span_values* carried, std::pair<int, int> blocks) {
  auto out = std::make_unique<request_lora>();
  if (!carried) {
    auto held = find_adapter(name);
    if (!held) return held.error();
    out->held = std::move(held.value());
    return out;
  }
  if (!name.empty()) return invalid("a request computes with a held adapter or its own, not both");
  const auto [from, to] = blocks;
  try {
    out->carried.emplace(lora_adapter::of_span(config(), *carried, to - from, stage_.backend()));
  } catch (const model_error& e) {
    return invalid(e.what());
  } catch (const std::exception& e) {  // no room on the device for its copy
    return span_error{span_errc::internal, std::string("the carried adapter could not be placed: ") + e.what()};
  }
  // Blocks before the request's take none (the factors are indexed as the
  // span indexes its blocks); the carried ones are views of the copy, in f32
  // like the stateless path's activations.
  out->carried_factors.blocks.resize(static_cast<std::size_t>(from));
  span_lora f = out->carried->training_factors(stage_.backend(), dtype::f32);
  for (block_lora& b : f.blocks) out->carried_factors.blocks.push_back(std::move(b));
  return out;
}

const Tensor& span_engine::train_positions(int batch, int seq) {
  if (!train_positions_.defined() || train_batch_ != batch || train_seq_ != seq) {
    std::vector<std::int32_t> pos(static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq));
    for (std::size_t i = 0; i < pos.size(); ++i)
      pos[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(seq));
    // on the host, like every index tensor (see stage::train_positions)
    train_positions_ = Tensor::from_i32(pos, {static_cast<std::int64_t>(pos.size())});
    train_batch_ = batch;
    train_seq_ = seq;
  }
  return train_positions_;
}

void span_engine::add_prompts(Tensor& x, int batch, int seq, const Tensor& prompts, int block) {
  Backend& be = stage_.backend();
  const std::int64_t P = prompts.dim(1), D = prompts.dim(2);
  const Tensor prompt = prompts.slice(block, block + 1).view({P, D});
  for (std::int64_t b = 0; b < batch; ++b) {
    Tensor rows = x.slice(b * seq, b * seq + P);
    be.add(rows, prompt, rows);
  }
}

Tensor span_engine::run_forward(const Tensor& x, int batch, int seq, const Tensor& prompts,
                                std::pair<int, int> blocks, std::vector<block_activations>* saved,
                                std::vector<float>* routing_margins, const span_lora* lora) {
  Backend& be = stage_.backend();
  const Tensor& pos = train_positions(batch, seq);
  const shape_t shape = x.shape();
  if (routing_margins) routing_margins->assign(static_cast<std::size_t>(x.dim(0)), INFINITY);
  block_activations scratch;
  Tensor in = x;  // engine-owned: the prompts are added in place
  for (int i = blocks.first; i < blocks.second; ++i) {
    if (prompts.defined()) add_prompts(in, batch, seq, prompts, i - blocks.first);
    Tensor out = be.empty(shape);
    block_activations& a = saved ? (*saved)[static_cast<std::size_t>(i - blocks.first)] : scratch;
    // With `saved`, a.x keeps `in` alive for the backward; `out` becomes the
    // next block's input and is never referenced by this block's activations.
    // An adapter's terms run beside the frozen weights (no merged copy).
    block_forward(be, config(), stage_.frozen_weights(i), in, pos, batch, seq, out, a,
                  block_lora_of(lora, static_cast<std::size_t>(i)));
    if (routing_margins && config().is_moe())
      for (std::int64_t r = 0; r < a.moe.route.rows; ++r) {
        float& m = (*routing_margins)[static_cast<std::size_t>(r)];
        m = std::min(m, routing_margin(a.moe.route, r));
      }
    in = std::move(out);
  }
  return in;
}

span_expected<Tensor> span_engine::forward(const Tensor& hidden, int batch, int seq,
                                           const Tensor& deep_prompts, int first_block, int last_block,
                                           std::vector<float>* routing_margins, const std::string& adapter,
                                           const lora_span_values* carried) {
  auto blocks = local_blocks(first_block, last_block);
  if (!blocks) return blocks.error();
  if (auto ok = check_forward(hidden, batch, seq, deep_prompts, blocks.value().second - blocks.value().first); !ok)
    return ok.error();
  const auto lora = request_adapter(adapter, carried, blocks.value());
  if (!lora) return lora.error();
  Backend& be = stage_.backend();
  const request_scope scope{*this};
  try {
    Tensor x = be.empty(hidden.shape());
    be.copy(hidden, x);
    Tensor prompts;
    if (deep_prompts.defined()) {
      prompts = be.empty(deep_prompts.shape());
      be.copy(deep_prompts, prompts);
    }
    return download(run_forward(x, batch, seq, prompts, blocks.value(), nullptr, routing_margins, lora.value()->factors()));
  } catch (const std::exception& e) {
    return span_error{span_errc::internal, std::string("span forward failed: ") + e.what()};
  }
}

span_expected<span_gradients> span_engine::backward(const Tensor& hidden,
                                                    const Tensor& grad_output, int batch, int seq,
                                                    const Tensor& deep_prompts, int first_block,
                                                    int last_block, const std::string& adapter,
                                                    const lora_span_values* carried) {
  auto blocks = local_blocks(first_block, last_block);
  if (!blocks) return blocks.error();
  const auto [from, to] = blocks.value();
  if (auto ok = check_forward(hidden, batch, seq, deep_prompts, to - from); !ok) return ok.error();
  if (auto ok = check_hidden(grad_output, "output gradients"); !ok) return ok.error();
  if (grad_output.shape() != hidden.shape())
    return invalid("output gradients are " + shape_str(grad_output.shape()) +
                   ", the hidden states " + shape_str(hidden.shape()));
  const auto lora = request_adapter(adapter, carried, blocks.value());
  if (!lora) return lora.error();
  const span_lora* factors = lora.value()->factors();
  lora_adapter* trained = lora.value()->carried ? &*lora.value()->carried : nullptr;
  Backend& be = stage_.backend();
  const request_scope scope{*this};
  try {
    Tensor x = be.empty(hidden.shape());
    be.copy(hidden, x);
    Tensor prompts;
    if (deep_prompts.defined()) {
      prompts = be.empty(deep_prompts.shape());
      be.copy(deep_prompts, prompts);
    }
    // Recompute the forward, keeping every block's activations (only for
    // the length of this call).
    std::vector<block_activations> saved(static_cast<std::size_t>(to - from));
    run_forward(x, batch, seq, prompts, blocks.value(), &saved, nullptr, factors);

    const Tensor& pos = train_positions(batch, seq);
    Tensor g = be.empty(hidden.shape());
    be.copy(grad_output, g);
    Tensor grad_prompts;
    std::int64_t P = 0;
    if (prompts.defined()) {
      grad_prompts = be.empty(prompts.shape());
      P = prompts.dim(1);
    }
    block_grad_scratch scratch;
    if (trained) trained->zero_grads();
    block_tensors frozen;  // every view undefined: no weight of the span trains
    for (int i = to - from - 1; i >= 0; --i) {
      const auto b = static_cast<std::size_t>(i);
      Tensor g_in = be.empty(hidden.shape());
      // A carried adapter hears each adapted weight's input and output
      // gradient (its low-rank gradients); otherwise only the input's
      // gradient is formed.
      block_backward(be, config(), stage_.frozen_weights(static_cast<int>(b) + from), saved[b], pos, g, g_in, frozen,
                     scratch, trained, i, block_lora_of(factors, b + static_cast<std::size_t>(from)));
      saved[b] = block_activations{};  // free this block's activations early
      if (prompts.defined()) {
        // d prompt_i = sum over sequences of the gradient at positions [0, P).
        Tensor gp = grad_prompts.slice(i, i + 1).view({P, config().hidden_size});
        be.copy(g_in.slice(0, P), gp);
        for (std::int64_t s = 1; s < batch; ++s) be.add(gp, g_in.slice(s * seq, s * seq + P), gp);
      }
      g = std::move(g_in);
    }
    span_gradients out;
    out.grad_input = download(g);
    if (prompts.defined()) out.grad_prompts = download(grad_prompts);
    if (trained) out.grad_lora = trained->span_values(0, to - from, /*grads=*/true);
    return out;
  } catch (const std::exception& e) {
    return span_error{span_errc::internal, std::string("span backward failed: ") + e.what()};
  }
}

}  // namespace corolla
