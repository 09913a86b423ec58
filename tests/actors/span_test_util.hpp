// tests/actors/span_test_util.hpp — small helpers of the in-process span
// server tests: nodes, random hidden rows, bit-exact comparison.
#pragma once

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "actors/corolla.hpp"
#include "kernels/tensor.hpp"

namespace corolla::testing {

/// A node with default options (listening on a free loopback port).
inline std::unique_ptr<node> start_node() {
  auto n = node::start({});
  REQUIRE_MESSAGE(n, error_message(n));
  return std::move(*n);
}

/// [rows, d] f32 rows of N(0, 1) values from `seed`.
inline Tensor random_rows(std::int64_t rows, std::int64_t d, std::uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<std::size_t>(rows * d));
  for (float& x : v) x = dist(g);
  return Tensor::from_f32(v, {rows, d});
}

/// A request of `type` from `client` to the "span" actor of node `peer`.
inline caf::expected<remote_message> span_call(node& client, const std::string& peer, const char* type,
                                               std::vector<std::uint8_t> body, std::vector<Tensor> tensors = {},
                                               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  remote_message m;
  m.type = type;
  m.body = std::move(body);
  m.tensors = std::move(tensors);
  return client.request(peer, "span", std::move(m), timeout);
}

/// Same shape and the very same bytes.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace corolla::testing
