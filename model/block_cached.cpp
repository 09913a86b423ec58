// model/block_cached.cpp — the cached inference forwards of a block (see
// model/block.hpp): one sequence's rows (prefill, decode) and a batch of
// sessions' rows, into a preallocated workspace, with f32, bf16 or int8
// inference weights.
#include <string>
#include <utility>
#include <vector>

#include "model/block.hpp"
#include "model/block_ops.hpp"

namespace corolla {
using namespace block_ops;

// ---- cached inference forward --------------------------------------------------------

block_decode_workspace::block_decode_workspace(const model_config& cfg)
    : norm_(cfg.hidden_size),
      mean_(0),
      rstd_(0),
      q_(q_width(cfg)),
      k_(kv_width(cfg)),
      v_(kv_width(cfg)),
      attn_(q_width(cfg)),
      tmp_(cfg.hidden_size),
      h_(cfg.hidden_size),
      // A mixture of experts keeps its rows in moe_ (they are N*k, not N).
      gate_(cfg.arch == architecture::llama && !cfg.is_moe() ? cfg.intermediate_size : 1),
      up_(cfg.is_moe() ? 1 : cfg.intermediate_size),
      act_(cfg.is_moe() ? 1 : cfg.intermediate_size),
      qkv_(q_width(cfg) + 2 * kv_width(cfg)),
      gate_up_(cfg.arch == architecture::llama ? 2 * cfg.intermediate_size : 1) ,
      qn_(cfg.qk_norm ? q_width(cfg) : 1),
      kn_(cfg.qk_norm ? kv_width(cfg) : 1) {}

void block_decode_workspace::reserve(Backend& be, std::int64_t rows) {
  for (row_buffer* b : {&norm_, &mean_, &rstd_, &q_, &k_, &v_, &attn_, &tmp_, &h_, &gate_, &up_, &act_, &qn_, &kn_})
    b->reserve(be, rows);
}

namespace {

/// Backend::linear_fused where the weight is not quantised (no fused quantised op).
bool fused(Backend& be, weight_format f, const Tensor& x, const Tensor& w, const Tensor* bias, linear_epilogue e,
           const Tensor* residual, Tensor& y) {
  return !is_quantized(f) && be.linear_fused(x, w, bias, e, residual, y);
}

/// The LoRA terms of one linear weight (`role` of each segment's block_lora)
/// added to its output y from its input x, segment by segment:
/// y[rows] += s (x[rows] A^T) B^T. `scratch` holds x A^T (grows only).
void add_lora(Backend& be, std::span<const lora_segment> segments, lora_factors block_lora::*role, const Tensor& x,
              Tensor& y, Tensor& scratch) {
  for (const lora_segment& seg : segments) {
    if (seg.rows == 0) continue;
    Tensor out = y.slice(seg.row, seg.row + seg.rows);
    add_lora_term(be, &(seg.lora->*role), x.slice(seg.row, seg.row + seg.rows), out, scratch);
  }
}

}  // namespace

/// The cached forward of stacked rows, shared by one sequence and by a batch
/// of sessions: everything row-wise runs once over all rows (in a batch, one
/// weight read serves every session); `attend(q, k, v, attn, stored)`
/// applies RoPE (Llama), appends the new keys and values to the cache(s)
/// and attends, per sequence. For one row with stacked weights (a decode
/// step), no q/k norms and weights that are not quantised,
/// `store_qkv(norm, q)` may first run the q/k/v product, RoPE and the
/// cache append as one op (Backend::linear_rope_store_kv) and says whether
/// it did: attend then finds q rotated and the cache row written
/// (`stored`), and only attends. `lora` adds adapters' terms to the rows
/// they cover; with any, the fused paths (store_qkv, the fused epilogues)
/// are skipped, since the terms go between a product and the op after it.
struct cached_forward {
  /// The workspace's views of q, k, v (gate, up) in the single-row outputs of
  /// the stacked products; made again only when those buffers are (so a
  /// warm decode step allocates nothing).
  static void stacked_views(Backend& be, const block_tensors& w, block_decode_workspace& ws) {
    const Tensor& qkv = ws.qkv_.rows(be, 1);
    const Tensor* gate_up = w.gate_up_w.defined() ? &ws.gate_up_.rows(be, 1) : nullptr;
    if (ws.views_of_ == qkv.raw() && ws.q1_.defined()) return;
    const std::int64_t qw = w.q_w.dim(0), kw = w.k_w.dim(0);
    const Tensor all = qkv.view({qw + 2 * kw});
    ws.q1_ = all.slice(0, qw).view({1, qw});
    ws.k1_ = all.slice(qw, qw + kw).view({1, kw});
    ws.v1_ = all.slice(qw + kw, qw + 2 * kw).view({1, kw});
    if (gate_up) {
      const std::int64_t F = w.gate_w.dim(0);
      const Tensor both = gate_up->view({2 * F});
      ws.gate1_ = both.slice(0, F).view({1, F});
      ws.up1_ = both.slice(F, 2 * F).view({1, F});
    }
    ws.views_of_ = qkv.raw();
  }

  template <class StoreQkv, class Attend>
  static void run(Backend& be, const model_config& cfg, const block_tensors& w, const Tensor& x,
                  const Tensor& positions, block_decode_workspace& ws, Tensor& y,
                  std::span<const lora_segment> lora, StoreQkv&& store_qkv, Attend&& attend) {
    const bool plain = lora.empty();
    const auto adapt = [&](lora_factors block_lora::*role, const Tensor& in, Tensor& out) {
      if (!plain) add_lora(be, lora, role, in, out, ws.lora_t_);
    };
    // Backend::linear_fused where no adapter's term must go in between.
    const auto fuse = [&](const Tensor& in, const Tensor& wt, const Tensor* bias, linear_epilogue e,
                          const Tensor* residual, Tensor& out) {
      return plain && fused(be, w.format, in, wt, bias, e, residual, out);
    };
    const std::int64_t R = x.dim(0);
    const bool llama = is_llama(cfg);
    // One row with stacked (inference) weights: one product per stack, and
    // q, k, v (gate, up) are consecutive pieces of its output row.
    const bool stacked = R == 1 && w.qkv_w.defined();
    Tensor& norm = ws.norm_.rows(be, R);
    Tensor& mean = ws.mean_.rows(be, R);
    Tensor& rstd = ws.rstd_.rows(be, R);
    if (stacked) stacked_views(be, w, ws);
    Tensor& q = stacked ? ws.q1_ : ws.q_.rows(be, R);
    Tensor& k = stacked ? ws.k1_ : ws.k_.rows(be, R);
    Tensor& v = stacked ? ws.v1_ : ws.v_.rows(be, R);
    Tensor& attn = ws.attn_.rows(be, R);
    Tensor& tmp = ws.tmp_.rows(be, R);
    Tensor& h = ws.h_.rows(be, R);

    // The statistics (mean, 1/std) are not needed later; they land in scratch.
    norm_forward(be, cfg, x, w.attn_norm_w, w.attn_norm_b, norm, &mean, &rstd);
    bool stored = false;
    if (stacked) {
      stored = plain && !cfg.qk_norm && !is_quantized(w.format) && store_qkv(norm, q);
      if (!stored) linear_as(be, w.format, norm, w.qkv_w, w.qkv_s, opt(w.qkv_b), ws.qkv_.rows(be, 1));
    } else {
      linear_as(be, w.format, norm, w.q_w, w.q_s, opt(w.q_b), q);
      linear_as(be, w.format, norm, w.k_w, w.k_s, opt(w.k_b), k);
      linear_as(be, w.format, norm, w.v_w, w.v_s, opt(w.v_b), v);
    }
    adapt(&block_lora::q, norm, q);
    adapt(&block_lora::k, norm, k);
    adapt(&block_lora::v, norm, v);
    if (cfg.qk_norm) {
      // Qwen3: q and k normed per head before RoPE, into their own rows.
      Tensor& qn = ws.qn_.rows(be, R);
      Tensor& kn = ws.kn_.rows(be, R);
      head_rmsnorm(be, cfg, q, w.q_norm_w, qn, nullptr);
      head_rmsnorm(be, cfg, k, w.k_norm_w, kn, nullptr);
      attend(qn, kn, v, attn, false);
    } else {
      attend(q, k, v, attn, stored);  // RoPE (Llama), the cache append and attention
    }
    // A product and the op after it run as one where the backend fuses
    // them (Backend::linear_fused: CUDA's bf16-weight GEMV), else as two.
    if (llama) {
      linear_as(be, w.format, attn, w.o_w, w.o_s, opt(w.o_b), tmp);
      adapt(&block_lora::o, attn, tmp);
      be.add_rmsnorm(x, tmp, h, w.mlp_norm_w, cfg.norm_eps, norm);
    } else {
      if (!fuse(attn, w.o_w, opt(w.o_b), linear_epilogue::add, &x, h)) {
        linear_as(be, w.format, attn, w.o_w, w.o_s, opt(w.o_b), tmp);
        adapt(&block_lora::o, attn, tmp);
        be.add(x, tmp, h);
      }
      norm_forward(be, cfg, h, w.mlp_norm_w, w.mlp_norm_b, norm, &mean, &rstd);
    }
    if (cfg.is_moe()) {
      // The experts' mixture of the normed rows (model/moe.hpp).
      moe_forward(be, cfg, w, norm, tmp, ws.moe_);
      be.add(h, tmp, y);
      return;
    }
    Tensor& up = ws.up_.rows(be, R);
    Tensor& act = ws.act_.rows(be, R);
    if (llama && stacked) {
      if (!fuse(norm, w.gate_up_w, nullptr, linear_epilogue::swiglu, nullptr, act)) {
        linear_as(be, w.format, norm, w.gate_up_w, w.gate_up_s, nullptr, ws.gate_up_.rows(be, 1));
        adapt(&block_lora::gate, norm, ws.gate1_);
        adapt(&block_lora::up, norm, ws.up1_);
        be.swiglu(ws.gate1_, ws.up1_, act);
      }
    } else if (llama) {
      Tensor& gate = ws.gate_.rows(be, R);
      linear_as(be, w.format, norm, w.gate_w, w.gate_s, nullptr, gate);
      linear_as(be, w.format, norm, w.up_w, w.up_s, nullptr, up);
      adapt(&block_lora::gate, norm, gate);
      adapt(&block_lora::up, norm, up);
      be.swiglu(gate, up, act);
    } else if (!fuse(norm, w.up_w, opt(w.up_b), linear_epilogue::gelu, nullptr, act)) {
      linear_as(be, w.format, norm, w.up_w, w.up_s, opt(w.up_b), up);
      adapt(&block_lora::up, norm, up);
      be.gelu(up, act);
    }
    if (!fuse(act, w.down_w, opt(w.down_b), linear_epilogue::add, &h, y)) {
      linear_as(be, w.format, act, w.down_w, w.down_s, opt(w.down_b), tmp);
      adapt(&block_lora::down, act, tmp);
      be.add(h, tmp, y);
    }
  }
};

void block_forward_cached(Backend& be, const model_config& cfg, const block_tensors& w,
                          const Tensor& x, const Tensor& positions, kv_sequence& kv, int layer,
                          std::int64_t start_pos, block_decode_workspace& ws, Tensor& y,
                          const block_lora* lora) {
  // One sequence: whole buffers, no slices (the decode hot path allocates nothing).
  const bool llama = is_llama(cfg);
  // A decode step's cache row, claimed once: by store_qkv, or by the
  // decode branch below when the backend has no fused product.
  std::pair<void*, void*> row{nullptr, nullptr};
  const auto store_qkv = [&](const Tensor& norm, Tensor& q) {
    row = kv.claim_row(layer, start_pos);
    return be.linear_rope_store_kv(norm, w.qkv_w, opt(w.qkv_b), positions, cfg.n_heads, cfg.n_kv_heads,
                                   cfg.head_dim, cfg.rope, llama, q, row.first, row.second, kv.pool().type());
  };
  const lora_segment whole{0, x.dim(0), lora};
  cached_forward::run(be, cfg, w, x, positions, ws, y,
                      lora ? std::span<const lora_segment>(&whole, 1) : std::span<const lora_segment>(), store_qkv,
                      [&](Tensor& q, Tensor& k, Tensor& v, Tensor& attn, bool stored) {
    if (stored) {
      // q rotated and the cache row written by the product's epilogue.
    } else if (q.dim(0) == 1) {
      // A decode step: RoPE and the cache append in one op, into the cache row.
      if (row.first == nullptr) row = kv.claim_row(layer, start_pos);
      auto [k_row, v_row] = row;
      be.rope_store_kv(q, k, v, positions, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rope, llama,
                       k_row, v_row, kv.pool().type());
    } else {
      if (llama) rope_qk(be, cfg, q, k, positions);
      kv.append(layer, start_pos, k, v);
    }
    be.attention_cached(q, kv.view(layer), start_pos, block_attention_shape(cfg), attn);
  });
}

// ---- batched cached forward (concurrent sessions of a server) ----------------------

void block_forward_cached_batch(Backend& be, const model_config& cfg, const block_tensors& w,
                                const Tensor& x, const Tensor& positions,
                                std::span<const cached_rows> seqs, int layer,
                                block_decode_workspace& ws, Tensor& y) {
  const std::int64_t R = x.dim(0);
  // One session's one row (a batch of one): the product's epilogue may
  // store it, as block_forward_cached's decode step.
  const auto store_qkv = [&](const Tensor& norm, Tensor& q) {
    if (seqs.size() != 1 || seqs[0].rows != 1) return false;
    auto [k_row, v_row] = seqs[0].kv->claim_row(layer, seqs[0].start_pos);
    return be.linear_rope_store_kv(norm, w.qkv_w, opt(w.qkv_b), positions, cfg.n_heads, cfg.n_kv_heads,
                                   cfg.head_dim, cfg.rope, is_llama(cfg), q, k_row, v_row,
                                   seqs[0].kv->pool().type());
  };
  // The rows of sessions with an adapter, each with block `layer` of it;
  // adjacent sessions of the same adapter are one segment (one pair of
  // products for all their rows).
  std::vector<lora_segment> lora;
  std::int64_t first_row = 0;
  for (const cached_rows& s : seqs) {
    if (s.lora) {
      const block_lora* b = block_lora_of(s.lora, static_cast<std::size_t>(layer));
      if (!lora.empty() && lora.back().lora == b && lora.back().row + lora.back().rows == first_row)
        lora.back().rows += s.rows;
      else
        lora.push_back({first_row, s.rows, b});
    }
    first_row += s.rows;
  }
  cached_forward::run(be, cfg, w, x, positions, ws, y, lora, store_qkv,
                      [&](Tensor& q, Tensor& k, Tensor& v, Tensor& attn, bool stored) {
    const attention_shape shape = block_attention_shape(cfg);
    if (stored) {
      be.attention_cached(q, seqs[0].kv->view(layer), seqs[0].start_pos, shape, attn);
      return;
    }
    std::int64_t rows = 0;
    bool one_row_each = true;
    for (const cached_rows& s : seqs) {
      rows += s.rows;
      one_row_each = one_row_each && s.rows == 1;
    }
    if (rows != R)
      throw tensor_error("block_forward_cached_batch: the sequences cover " + std::to_string(rows) +
                         " rows of a batch of " + std::to_string(R));
    if (one_row_each && seqs.size() > 1) {
      // A decode batch: RoPE (Llama) and every session's cache append in
      // one op, then attention of every session against its own cache in
      // one (a launch each on a device, not two per session).
      std::vector<kv_pages_view> views;
      std::vector<std::int64_t> starts;
      for (const cached_rows& s : seqs) {
        s.kv->claim_row(layer, s.start_pos);  // the layer now counts the row the op writes
        views.push_back(s.kv->view(layer));
        starts.push_back(s.start_pos);
      }
      be.rope_store_kv_pages(q, k, v, positions, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, views, starts, cfg.rope,
                             is_llama(cfg));
      be.attention_cached_batch(q, views, starts, shape, attn);
      return;
    }
    if (is_llama(cfg)) rope_qk(be, cfg, q, k, positions);  // each row at its own position
    std::int64_t row = 0;
    for (const cached_rows& s : seqs) {
      const std::int64_t end = row + s.rows;
      s.kv->append(layer, s.start_pos, k.slice(row, end), v.slice(row, end));
      Tensor out = attn.slice(row, end);
      be.attention_cached(q.slice(row, end), s.kv->view(layer), s.start_pos, shape, out);
      row = end;
    }
  });
}

}  // namespace corolla
