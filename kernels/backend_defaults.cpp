// kernels/backend_defaults.cpp — the Backend's default forms of its
// optional grouped ops (linear_same_x and its backward: one op per
// product), for backends without a batched form. In a file of its own,
// apart from backend.cpp's backend registry: the class's vtable is emitted
// with the first of these, and a program that links only the tensor layer
// (the fuzz targets) must not pull in the CUDA backend with it.
#include <string>

#include "kernels/backend.hpp"

namespace corolla {

namespace {

void require_same_x_counts(std::size_t ws, std::size_t bs, std::size_t outs, const char* op, const char* what) {
  if (ws == 0 || outs != ws || (bs != 0 && bs != ws))
    throw tensor_error(std::string(op) + ": " + std::to_string(ws) + " weights, " + std::to_string(outs) + " " + what +
                       " and " + std::to_string(bs) + " biases (one of each per weight, biases optional)");
}

}  // namespace

void Backend::linear_same_x(const Tensor& x, std::span<const Tensor* const> ws, std::span<const Tensor* const> bs,
                            std::span<Tensor* const> ys) {
  require_same_x_counts(ws.size(), bs.size(), ys.size(), "linear_same_x", "outputs");
  for (std::size_t i = 0; i < ws.size(); ++i) linear(x, *ws[i], bs.empty() ? nullptr : bs[i], *ys[i]);
}

void Backend::linear_same_x_backward(const Tensor& x, std::span<const Tensor* const> ws,
                                     std::span<const Tensor* const> dys, Tensor* dx, std::span<Tensor* const> dws,
                                     std::span<Tensor* const> dbs) {
  require_same_x_counts(ws.size(), dbs.size(), dys.size(), "linear_same_x_backward", "output gradients");
  if (dws.size() != ws.size())
    throw tensor_error("linear_same_x_backward: " + std::to_string(dws.size()) + " weight gradients for " +
                       std::to_string(ws.size()) + " weights");
  for (std::size_t i = 0; i < ws.size(); ++i) {
    linear_backward(x, *ws[i], *dys[i], i == 0 ? dx : nullptr, *dws[i], dbs.empty() ? nullptr : dbs[i]);
    if (i > 0 && dx) gemm(*dys[i], false, *ws[i], false, *dx, 1.0f, 1.0f);
  }
}

}  // namespace corolla
