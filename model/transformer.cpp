// model/transformer.cpp — the whole model in one process: a head and one
// stage spanning every block (see model/transformer.hpp).
#include "model/transformer.hpp"

#include <algorithm>
#include <filesystem>
#include <string>

#include "model/error.hpp"
#include "model/head.hpp"
#include "model/initialisation.hpp"
#include "model/model_writer.hpp"
#include "model/safetensors.hpp"
#include "model/stage.hpp"

namespace corolla {

struct transformer::impl {
  model_config cfg;
  Backend* be;
  class head head_part;
  class stage block_span;

  // Training buffers, reused across steps of the same shape.
  Tensor ids, targets, positions;
  Tensor x, y, dy, dx;
  stage_activations acts;
  head_activations head_acts;
  bool frozen_head = false;  ///< set_trained_weights: no head gradients formed

  impl(model_config c, class head h, class stage s, Backend& b)
      : cfg(std::move(c)), be(&b), head_part(std::move(h)), block_span(std::move(s)) {}

  /// Checks a batch against the model and uploads ids, targets and positions.
  void prepare(std::span<const std::int32_t> id_span, std::span<const std::int32_t> target_span,
               int batch, int seq);
  /// Embeds ids into x and runs the blocks into y (saving activations when asked).
  void forward(int batch, int seq, bool save);
};

void transformer::impl::prepare(std::span<const std::int32_t> id_span,
                                std::span<const std::int32_t> target_span, int batch, int seq) {
  if (batch <= 0 || seq <= 0)
    throw model_error("batch (" + std::to_string(batch) + ") and sequence length (" +
                      std::to_string(seq) + ") must be positive");
  if (seq > cfg.max_positions)
    throw model_error("sequence length " + std::to_string(seq) + " exceeds the model context of " +
                      std::to_string(cfg.max_positions));
  const auto n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
  if (id_span.size() != n || (!target_span.empty() && target_span.size() != n))
    throw model_error("a batch of " + std::to_string(batch) + " x " + std::to_string(seq) +
                      " needs " + std::to_string(n) + " ids and targets, got " +
                      std::to_string(id_span.size()) + " and " +
                      std::to_string(target_span.size()));
  for (std::size_t i = 0; i < n; ++i) {
    if (id_span[i] < 0 || id_span[i] >= cfg.vocab_size)
      throw model_error("token id " + std::to_string(id_span[i]) + " is outside the vocabulary (" +
                        std::to_string(cfg.vocab_size) + " tokens)");
    if (!target_span.empty() && (target_span[i] < -1 || target_span[i] >= cfg.vocab_size))
      throw model_error("target id " + std::to_string(target_span[i]) +
                        " is outside the vocabulary (" + std::to_string(cfg.vocab_size) +
                        " tokens)");
  }
  // Index tensors stay on the host whatever the backend (model/workspace.hpp).
  const auto N = static_cast<std::int64_t>(n);
  Backend& host = cpu_backend();
  ensure_tensor(host, ids, {N}, dtype::i32);
  copy_i32(id_span, ids);
  if (!target_span.empty()) {
    ensure_tensor(host, targets, {N}, dtype::i32);
    copy_i32(target_span, targets);
  }
  std::vector<std::int32_t> pos(n);
  for (std::size_t i = 0; i < n; ++i) pos[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(seq));
  ensure_tensor(host, positions, {N}, dtype::i32);
  copy_i32(pos, positions);
}

void transformer::impl::forward(int batch, int seq, bool save) {
  const std::int64_t N = static_cast<std::int64_t>(batch) * seq;
  ensure_tensor(*be, x, {N, cfg.hidden_size});
  ensure_tensor(*be, y, {N, cfg.hidden_size});
  head_part.embed(ids, positions, x);
  block_span.forward(x, batch, seq, y, save ? &acts : nullptr);
}

// ---- construction -----------------------------------------------------------------

transformer::transformer(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
transformer::transformer(transformer&&) noexcept = default;
transformer& transformer::operator=(transformer&&) noexcept = default;
transformer::~transformer() = default;

transformer transformer::load(const std::filesystem::path& dir, Backend& be,
                              const std::function<void(int done, int total)>& on_block,
                              std::shared_ptr<const block_patch> patch) {
  model_config cfg = load_config(dir);
  checkpoint ck = checkpoint::open(dir);
  ck.set_patch(std::move(patch));
  // Both place their parameters on the backend's device.
  class head h = head::load(ck, cfg, be);
  class stage s = stage::load(ck, cfg, 0, cfg.n_layers, be, on_block);
  return transformer(std::make_unique<impl>(cfg, std::move(h), std::move(s), be));
}

transformer transformer::load_inference(const std::filesystem::path& dir, Backend& be, weight_format f,
                                       const std::function<void(int done, int total)>& on_block,
                                       std::shared_ptr<const block_patch> patch) {
  if (f == weight_format::f32)
    throw tensor_error("transformer::load_inference: f32 weights are the parameters (use transformer::load)");
  model_config cfg = load_config(dir);
  checkpoint ck = checkpoint::open(dir);
  ck.set_patch(std::move(patch));
  class head h = head::load(ck, cfg, be);
  class stage s = stage::load_inference(ck, cfg, 0, cfg.n_layers, be, f, on_block);
  return transformer(std::make_unique<impl>(cfg, std::move(h), std::move(s), be));
}

transformer transformer::inference_of(transformer& model, weight_format f) {
  if (f == weight_format::f32)
    throw tensor_error("transformer::inference_of: f32 weights are the parameters (use the model itself)");
  const model_config& cfg = model.config();
  Backend& be = model.backend();
  class stage s = stage::inference_of(cfg, 0, model.blocks(), be, f);  // throws for an inference-only model
  param_set h = model.head().like();
  be.copy(model.head().flat(), h.flat());
  class head hd(cfg, std::move(h), be);
  return transformer(std::make_unique<impl>(cfg, std::move(hd), std::move(s), be));
}

transformer transformer::init_with(const model_config& cfg, std::uint64_t seed, Backend& be,
                                   bool tiled) {
  // Each group is drawn on the host, then placed on the backend's device.
  initial_params drawn = draw_initial_params(cfg, seed, initial_groups::all(), be, tiled);
  std::vector<param_set> blocks;
  blocks.reserve(drawn.blocks.size());
  for (auto& [index, p] : drawn.blocks) blocks.push_back(std::move(p));
  class head h(cfg, std::move(*drawn.head), be);
  class stage s(cfg, 0, std::move(blocks), be);
  return transformer(std::make_unique<impl>(cfg, std::move(h), std::move(s), be));
}

transformer transformer::init(const model_config& cfg, std::uint64_t seed, Backend& be) {
  return init_with(cfg, seed, be, false);
}

transformer transformer::init_tiled(const model_config& cfg, std::uint64_t seed, Backend& be) {
  return init_with(cfg, seed, be, true);
}

// ---- accessors --------------------------------------------------------------------

const model_config& transformer::config() const { return impl_->cfg; }
Backend& transformer::backend() const { return *impl_->be; }
param_set& transformer::head() { return impl_->head_part.params(); }
std::vector<param_set>& transformer::blocks() {
  require_block_parameters("blocks");
  return impl_->block_span.params();
}
const class stage& transformer::block_stage() const { return impl_->block_span; }
bool transformer::inference_only() const { return impl_->block_span.inference_only(); }

void transformer::require_decoding_format(weight_format f) const {
  const weight_format own = impl_->block_span.inference_format();
  if (inference_only() && f != own)
    throw model_error(std::string("the model was loaded with ") + weight_format_name(own) +
                      " weights for inference only; it decodes with those, not " + weight_format_name(f));
}

stage transformer::decoding_stage() {
  if (inference_only()) return stage::sharing_inference_weights(impl_->block_span);
  return stage(config(), 0, blocks(), backend());
}

void transformer::require_block_parameters(const char* what) const {
  if (inference_only())
    throw tensor_error(std::string("transformer::") + what + ": this model was loaded for inference only (" +
                       weight_format_name(impl_->block_span.inference_format()) +
                       " weights; its f32 block parameters were not kept)");
}

std::vector<param_group> transformer::groups() {
  require_block_parameters("groups");  // before the head's gradients are made
  std::vector<param_group> out;
  out.push_back({&impl_->head_part.params(), &impl_->head_part.grads()});
  auto& grads = impl_->block_span.grads();
  auto& params = impl_->block_span.params();
  for (std::size_t i = 0; i < params.size(); ++i) out.push_back({&params[i], &grads[i]});
  return out;
}

std::int64_t transformer::gradient_values() const {
  std::int64_t n = impl_->head_part.has_grads() ? impl_->head_part.params().size() : 0;
  if (impl_->block_span.has_grads())
    for (const param_set& p : impl_->block_span.params()) n += p.size();
  return n;
}

void transformer::release_frozen_weights() { impl_->block_span.release_frozen_weights(); }

void transformer::set_trained_weights(std::optional<std::set<std::string>> block_weights,
                                      frozen_weight_grads* frozen, const span_lora* lora) {
  // The stage checks the names first (and that inference weights train none).
  impl_->block_span.set_trained_weights(block_weights, frozen, lora);
  impl_->frozen_head = block_weights.has_value();
}

void transformer::zero_grads() {
  impl_->head_part.zero_grads();
  impl_->block_span.zero_grads();
}

void transformer::set_compute_dtype(dtype t) { impl_->block_span.set_compute_dtype(t); }
dtype transformer::compute_dtype() const { return impl_->block_span.compute_dtype(); }
void transformer::params_changed() { impl_->block_span.params_changed(); }

std::vector<Tensor> transformer::compute_copies() const {
  std::vector<Tensor> out(1);  // the head computes in f32
  const std::vector<Tensor>& blocks = impl_->block_span.compute_copies();
  if (blocks.empty())
    out.resize(1 + impl_->block_span.params().size());
  else
    out.insert(out.end(), blocks.begin(), blocks.end());
  return out;
}

void transformer::compute_copies_written() { impl_->block_span.compute_copies_written(); }

// ---- compute ----------------------------------------------------------------------

float transformer::forward_backward(std::span<const std::int32_t> ids,
                                    std::span<const std::int32_t> targets, int batch, int seq,
                                    float grad_scale) {
  impl& m = *impl_;
  if (targets.empty()) throw model_error("forward_backward needs targets");
  if (!m.frozen_head) require_block_parameters("forward_backward (an adapter trains beside them: lora_tuning)");
  m.prepare(ids, targets, batch, seq);
  m.forward(batch, seq, true);
  const std::int64_t N = static_cast<std::int64_t>(batch) * seq;
  ensure_tensor(*m.be, m.dy, {N, m.cfg.hidden_size});
  ensure_tensor(*m.be, m.dx, {N, m.cfg.hidden_size});
  float loss = m.head_part.loss(m.y, m.targets, &m.dy, grad_scale, m.head_acts, !m.frozen_head);
  m.block_span.backward(m.acts, m.dy, m.dx);
  if (!m.frozen_head) m.head_part.embed_backward(m.ids, m.positions, m.dx);
  return loss;
}

float transformer::forward_loss(std::span<const std::int32_t> ids,
                                std::span<const std::int32_t> targets, int batch, int seq) {
  impl& m = *impl_;
  if (targets.empty()) throw model_error("forward_loss needs targets");
  m.prepare(ids, targets, batch, seq);
  m.forward(batch, seq, false);
  return m.head_part.loss(m.y, m.targets, nullptr, 1.0f, m.head_acts);
}

Tensor transformer::forward_logits(std::span<const std::int32_t> ids) {
  impl& m = *impl_;
  const int seq = static_cast<int>(ids.size());
  m.prepare(ids, {}, 1, seq);
  m.forward(1, seq, false);
  Tensor logits = m.be->empty({seq, m.cfg.vocab_size});
  m.head_part.logits(m.y, logits, nullptr);
  return logits;
}

// ---- save -------------------------------------------------------------------------

void transformer::save(const std::filesystem::path& dir) const {
  require_block_parameters("save");  // a checkpoint holds the f32 parameters
  model_writer w(dir, impl_->cfg);
  w.write_head(impl_->head_part.params());
  const auto& blocks = impl_->block_span.params();
  for (int i = 0; i < static_cast<int>(blocks.size()); ++i) w.write_block(i, blocks[static_cast<std::size_t>(i)]);
  w.commit();
}

}  // namespace corolla
