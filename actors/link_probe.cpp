// Measuring a link's bandwidth with echoes (actors/link_probe.hpp).
#include "actors/link_probe.hpp"

#include <algorithm>
#include <limits>

#include "actors/echo_actor.hpp"
#include "actors/errors.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"

namespace corolla {

namespace {

/// The fastest of `rounds` echoes carrying `payload` (undefined: none).
caf::expected<double> fastest_echo(node& n, const std::string& peer, const Tensor& payload, const link_probe_options& o) {
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < o.rounds; ++i) {
    remote_message m;
    m.type = "echo";
    if (payload.defined()) m.tensors.push_back(payload);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = n.request(peer, echo_actor_name, std::move(m), o.timeout);
    if (!r) return r.error();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (payload.defined() && (r->tensors.size() != 1 || r->tensors[0].nbytes() != payload.nbytes()))
      return make_error(errc::bad_message, "the echo of the probe's payload came back with other bytes");
    best = std::min(best, s);
  }
  return best;
}

}  // namespace

caf::expected<double> echo_rtt(node& n, const std::string& peer, int rounds, std::chrono::milliseconds timeout) {
  link_probe_options o;
  o.rounds = std::max(1, rounds);
  o.timeout = timeout;
  return fastest_echo(n, peer, Tensor{}, o);
}

caf::expected<link_probe_result> probe_link(node& n, const std::string& peer, const link_probe_options& o) {
  if (o.bytes < 4 || o.rounds < 1) return make_error(errc::invalid_argument, "a link probe needs a payload and a round");
  link_probe_result res;
  auto small = fastest_echo(n, peer, Tensor{}, o);
  if (!small) return small.error();
  res.rtt_s = *small;
  const Tensor payload = Tensor::zeros({static_cast<std::int64_t>(o.bytes / 4)});
  auto large = fastest_echo(n, peer, payload, o);
  if (!large) return large.error();
  res.payload_s = *large;
  const double carry_s = res.payload_s - res.rtt_s;
  if (carry_s <= 0)
    return make_error(errc::invalid_argument, "the link to " + peer + " carried " + std::to_string(o.bytes) +
                                                  " bytes no slower than an empty echo: too fast to measure this way");
  res.bps = 16.0 * static_cast<double>(payload.nbytes()) / carry_s;
  return res;
}

}  // namespace corolla
