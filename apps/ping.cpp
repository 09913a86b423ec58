// corolla ping — echo round trips with tensors to a node: every echoed
// tensor's checksum must match what was sent, bit for bit. Prints RTT
// percentiles and throughput (bytes both ways / time spent in requests).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "actors/corolla.hpp"
#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "net/codec.hpp"
#include "net/wire.capnp.h"
#include "net/zmq_transport.hpp"

namespace corolla::app {
namespace {

struct ping_args {
  std::string peer;
  int count = 10;
  std::size_t size = 1024;
  std::string link_profile;
  std::string curve_keys;
  std::string server_key;
  int timeout_ms = 5000;
  bool json = false;
  std::string log_level = "warn";
};

/// splitmix64: fast, good enough to make every payload different.
struct payload_rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
};

/// A random tensor of exactly `bytes` bytes: f32 values in [-1, 1) when the
/// size is a multiple of 4, else i8.
Tensor random_tensor(std::size_t bytes, payload_rng& rng) {
  const bool f32 = bytes % 4 == 0;
  Tensor t = Tensor::empty({static_cast<std::int64_t>(f32 ? bytes / 4 : bytes)}, f32 ? dtype::f32 : dtype::i8);
  auto* p = static_cast<unsigned char*>(t.raw());
  if (f32) {
    float* v = t.data<float>();
    const std::size_t n = bytes / 4;
    for (std::size_t i = 0; i < n; i += 2) {
      const std::uint64_t r = rng.next();
      for (std::size_t j = 0; j < 2 && i + j < n; ++j) {
        const std::uint32_t bits = 0x40000000u | static_cast<std::uint32_t>((r >> (32 * j)) & 0x7fffffu);
        float x;  // [2, 4) -> [-1, 1)
        std::memcpy(&x, &bits, sizeof x);
        v[i + j] = x - 3.0f;
      }
    }
  } else {
    for (std::size_t i = 0; i < bytes; i += 8) {
      const std::uint64_t r = rng.next();
      std::memcpy(p + i, &r, std::min<std::size_t>(8, bytes - i));
    }
  }
  return t;
}

std::vector<std::uint8_t> echo_body(std::uint64_t sequence) {
  capnp::MallocMessageBuilder builder;
  builder.initRoot<wire::Echo>().setSequence(sequence);
  auto words = capnp::messageToFlatArray(builder);
  auto bytes = words.asBytes();
  return {bytes.begin(), bytes.end()};
}

/// The sequence number in an echoed body; throws for a malformed one.
std::uint64_t echo_sequence(const std::vector<std::uint8_t>& body) {
  if (body.empty() || body.size() % sizeof(capnp::word) != 0)
    throw std::runtime_error("echoed body of " + std::to_string(body.size()) + " bytes is not a Cap'n Proto message");
  std::vector<capnp::word> words(body.size() / sizeof(capnp::word));
  std::memcpy(words.data(), body.data(), body.size());
  capnp::FlatArrayMessageReader reader(kj::arrayPtr(words.data(), words.size()));
  return reader.getRoot<wire::Echo>().getSequence();
}

double percentile(std::vector<double> sorted, double p) {
  if (sorted.empty()) return 0;
  std::sort(sorted.begin(), sorted.end());
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}

std::string format_duration_us(double us) {
  char buf[32];
  if (us < 1000)
    std::snprintf(buf, sizeof buf, "%.1f us", us);
  else
    std::snprintf(buf, sizeof buf, "%.2f ms", us / 1000);
  return buf;
}

int run_ping(const ping_args& a) {
  // stdout carries only this command's output (readiness line, results);
  // logs go to stderr.
  auto to_stderr = spdlog::get("corolla-stderr");
  spdlog::set_default_logger(to_stderr ? to_stderr : spdlog::stderr_color_mt("corolla-stderr"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  apply_common_options(0, a.log_level);
  if (a.count < 1) throw std::runtime_error("--count must be at least 1");
  if (!a.curve_keys.empty() && a.server_key.empty())
    throw std::runtime_error("--curve-keys needs --server-key (the node's public key, printed in its readiness line)");
  if (!a.server_key.empty() && a.curve_keys.empty())
    throw std::runtime_error("--server-key needs --curve-keys (this client's key directory: CurveZMQ authenticates "
                             "both ends)");
  if (!a.server_key.empty() && !net::is_curve_key(a.server_key))
    throw std::runtime_error("--server-key must be the node's CurveZMQ public key (40 Z85 characters, as its "
                             "readiness line prints it), got '" + a.server_key + "'");

  node_options o;
  o.listen = "";  // a client: the node answers over our connection
  o.curve_dir = a.curve_keys;
  auto started = node::start(o);
  if (!started) throw std::runtime_error(error_message(started.error()));
  auto& n = **started;

  const auto timeout = std::chrono::milliseconds(a.timeout_ms);
  connect_options c;
  c.timeout = timeout;
  c.link_profile = a.link_profile;
  c.server_key = a.server_key;
  auto peer = n.connect(a.peer, c);
  if (!peer) throw std::runtime_error("cannot reach " + a.peer + ": " + error_message(peer.error()));
  auto echo = n.remote_actor(*peer, "echo");
  if (!echo) throw std::runtime_error(error_message(echo.error()));

  payload_rng rng{static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  std::vector<double> rtts_us;
  double busy_s = 0;
  std::uint64_t bytes_both_ways = 0;
  std::string failure;
  {
    caf::scoped_actor self{n.system()};
    for (int i = 0; i < a.count && failure.empty(); ++i) {
      remote_message m;
      m.type = "echo";
      m.body = echo_body(static_cast<std::uint64_t>(i));
      m.tensors.push_back(random_tensor(a.size, rng));
      const Tensor sent = m.tensors[0];
      const std::uint64_t checksum = net::frame_checksum(sent.raw(), sent.nbytes());
      const auto t0 = std::chrono::steady_clock::now();
      caf::expected<remote_message> reply{make_error(errc::peer_down, "no answer")};
      self->request(*echo, timeout, std::move(m))
          .receive([&](remote_message& r) { reply = std::move(r); }, [&](caf::error& e) { reply = std::move(e); });
      const double rtt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string which = "echo " + std::to_string(i + 1) + " of " + std::to_string(a.count);
      if (!reply) {
        failure = which + ": " +
                  (error_code(reply.error()) == "request_timeout"
                       ? "no answer within " + std::to_string(a.timeout_ms) + " ms"
                       : error_message(reply.error()));
        break;
      }
      if (reply->tensors.size() != 1) {
        failure = which + ": expected 1 tensor back, got " + std::to_string(reply->tensors.size());
        break;
      }
      const Tensor& got = reply->tensors[0];
      if (got.type() != sent.type() || got.shape() != sent.shape()) {
        failure = which + ": echoed tensor is " + dtype_name(got.type()) + " " + shape_str(got.shape()) +
                  ", sent " + dtype_name(sent.type()) + " " + shape_str(sent.shape());
        break;
      }
      const std::uint64_t echoed = net::frame_checksum(got.raw(), got.nbytes());
      if (echoed != checksum) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "checksum mismatch (sent %016llx, echoed %016llx)",
                      static_cast<unsigned long long>(checksum), static_cast<unsigned long long>(echoed));
        failure = which + ": " + buf;
        break;
      }
      try {
        if (echo_sequence(reply->body) != static_cast<std::uint64_t>(i)) failure = which + ": wrong sequence number echoed";
      } catch (const std::exception& e) {
        failure = which + ": " + e.what();
      }
      rtts_us.push_back(rtt_s * 1e6);
      busy_s += rtt_s;
      bytes_both_ways += 2 * sent.nbytes();
    }
  }
  if (!failure.empty()) throw std::runtime_error(failure);

  const double p50 = percentile(rtts_us, 0.50), p99 = percentile(rtts_us, 0.99);
  const double mb_s = busy_s > 0 ? static_cast<double>(bytes_both_ways) / busy_s / 1e6 : 0;
  auto stats = n.stats(*peer);
  if (a.json) {
    nlohmann::json j;
    j["peer"] = *peer;
    j["endpoint"] = a.peer;
    j["count"] = a.count;
    j["size"] = a.size;
    j["ok"] = rtts_us.size();
    j["rtt_p50_us"] = p50;
    j["rtt_p99_us"] = p99;
    j["rtt_min_us"] = *std::min_element(rtts_us.begin(), rtts_us.end());
    j["rtt_max_us"] = *std::max_element(rtts_us.begin(), rtts_us.end());
    j["throughput_mb_s"] = mb_s;
    j["bytes"] = bytes_both_ways;
    j["seconds"] = busy_s;
    if (stats) {
      j["profile"] = stats->profile;
      j["heartbeat_rtt_us"] = stats->rtt_us;
      j["nic_class"] = stats->nic_class;
      j["transport"] = stats->transport;
      j["transport_reason"] = stats->transport_reason;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("corolla ping: %s at %s, %d x %zu bytes%s\n", peer->c_str(), a.peer.c_str(), a.count, a.size,
                stats ? (", link " + stats->profile).c_str() : "");
    std::printf("rtt p50 %s  p99 %s  min %s  max %s\n", format_duration_us(p50).c_str(),
                format_duration_us(p99).c_str(),
                format_duration_us(*std::min_element(rtts_us.begin(), rtts_us.end())).c_str(),
                format_duration_us(*std::max_element(rtts_us.begin(), rtts_us.end())).c_str());
    std::printf("throughput %.2f MB/s (%llu bytes both ways in %.3f s), %zu/%d echoes bit-exact\n", mb_s,
                static_cast<unsigned long long>(bytes_both_ways), busy_s, rtts_us.size(), a.count);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

void register_ping(CLI::App& app, action_fn& action) {
  auto a = std::make_shared<ping_args>();
  auto* cmd = app.add_subcommand("ping", "Echo tensors off a node, check them bit-exact, print RTT and throughput");
  cmd->add_option("--peer", a->peer, "Endpoint of the node, e.g. tcp://127.0.0.1:41234")->required();
  cmd->add_option("--count", a->count, "Number of echo requests")->check(CLI::Range(1, 100000000))->capture_default_str();
  cmd->add_option("--size", a->size, "Bytes of the tensor in each request (at most 1023 MiB: a message is at most 1 GiB)")
      ->check(integer_between(1, (1 << 30) - (1 << 20)))
      ->capture_default_str();
  cmd->add_option("--link-profile", a->link_profile,
                  "Shape this link (both directions): none, ib, roce, ethernet, wan, consumer, or "
                  "bw=200Mbit,lat=5ms,...");
  cmd->add_option("--curve-keys", a->curve_keys, "CurveZMQ key directory of this client");
  cmd->add_option("--server-key", a->server_key, "The node's CurveZMQ public key (Z85)");
  cmd->add_option("--timeout-ms", a->timeout_ms, "Timeout for connecting and for each echo (milliseconds)")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object on stdout instead of text");
  cmd->add_option("--log-level", a->log_level, "trace, debug, info, warn, error, off")->capture_default_str();
  cmd->callback([&action, a] { action = [a] { return run_ping(*a); }; });
}

}  // namespace corolla::app
