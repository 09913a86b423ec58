#include "kernels/same_x_batch.hpp"

namespace corolla {

namespace {

std::span<const Tensor* const> as_const(std::span<Tensor* const> ts) { return {ts.data(), ts.size()}; }

bool batchable_x(const Tensor& x) {
  return x.defined() && x.rank() == 2 && is_float_dtype(x.type()) && x.dim(0) > 0 && x.dim(1) > 0;
}

}  // namespace

std::optional<std::int64_t> even_spacing(std::span<const Tensor* const> ts, bool disjoint) {
  if (ts.size() < 2 || !ts[0] || !ts[1] || !ts[0]->defined() || !ts[1]->defined()) return std::nullopt;
  const Tensor& first = *ts[0];
  const auto size = static_cast<std::int64_t>(dtype_size(first.type()));
  const auto* base = static_cast<const char*>(first.raw());
  const std::int64_t bytes = static_cast<const char*>(ts[1]->raw()) - base;
  if (bytes <= 0 || bytes % size != 0 || (disjoint && bytes / size < first.numel())) return std::nullopt;
  for (std::size_t i = 1; i < ts.size(); ++i) {
    const Tensor* t = ts[i];
    if (!t || !t->defined() || t->type() != first.type() || t->shape() != first.shape() ||
        t->dev() != first.dev() || static_cast<const char*>(t->raw()) != base + static_cast<std::int64_t>(i) * bytes)
      return std::nullopt;
  }
  return bytes / size;
}

std::optional<same_x_strides> linear_same_x_batch(const Tensor& x, std::span<const Tensor* const> ws,
                                                  std::span<const Tensor* const> bs, std::span<Tensor* const> ys) {
  if (!batchable_x(x) || ys.size() != ws.size() || (!bs.empty() && bs.size() != ws.size())) return std::nullopt;
  const std::optional<std::int64_t> w = even_spacing(ws, false), y = even_spacing(as_const(ys), true);
  if (!w || !y || ws[0]->type() != x.type() || ws[0]->rank() != 2 || ws[0]->dim(0) == 0) return std::nullopt;
  std::size_t biases = 0;
  for (const Tensor* b : bs) biases += b != nullptr;
  if (biases == 0) return same_x_strides{*w, *y, 0};
  const std::optional<std::int64_t> b = biases == ws.size() ? even_spacing(bs, false) : std::nullopt;
  if (!b || bs[0]->type() != ys[0]->type()) return std::nullopt;
  return same_x_strides{*w, *y, *b};
}

std::optional<same_x_strides> linear_same_x_backward_batch(const Tensor& x, std::span<const Tensor* const> ws,
                                                           std::span<const Tensor* const> dys,
                                                           std::span<Tensor* const> dws,
                                                           std::span<Tensor* const> dbs) {
  const bool paired = dys.size() == ws.size() && dws.size() == ws.size() && (dbs.empty() || dbs.size() == ws.size());
  if (!batchable_x(x) || !paired) return std::nullopt;
  const std::optional<std::int64_t> dy = even_spacing(dys, false), dw = even_spacing(as_const(dws), true);
  if (!dy || !dw || dys[0]->type() != x.type() || dys[0]->rank() != 2 || dys[0]->dim(1) == 0) return std::nullopt;
  return same_x_strides{*dw, *dy, 0};
}

namespace {

template <class T>
std::span<T> rest(std::span<T> ts) {
  return ts.empty() ? ts : ts.subspan(1);
}

}  // namespace

std::optional<same_x_batch> linear_same_x_plan(const Tensor& x, std::span<const Tensor* const> ws,
                                               std::span<const Tensor* const> bs, std::span<Tensor* const> ys) {
  if (const auto all = linear_same_x_batch(x, ws, bs, ys)) return same_x_batch{0, *all};
  if (ws.size() < 3 || ys.size() != ws.size()) return std::nullopt;
  if (const auto tail = linear_same_x_batch(x, rest(ws), rest(bs), rest(ys))) return same_x_batch{1, *tail};
  return std::nullopt;
}

std::optional<same_x_batch> linear_same_x_backward_plan(const Tensor& x, std::span<const Tensor* const> ws,
                                                        std::span<const Tensor* const> dys,
                                                        std::span<Tensor* const> dws, std::span<Tensor* const> dbs) {
  if (const auto all = linear_same_x_backward_batch(x, ws, dys, dws, dbs)) return same_x_batch{0, *all};
  if (ws.size() < 3 || dys.size() != ws.size() || dws.size() != ws.size()) return std::nullopt;
  if (const auto tail = linear_same_x_backward_batch(x, rest(ws), rest(dys), rest(dws), rest(dbs)))
    return same_x_batch{1, *tail};
  return std::nullopt;
}

}  // namespace corolla
