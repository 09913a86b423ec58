// corolla bench interleave — how long a small request waits while a large
// message is on the same link, with fragments (the transport's default) and
// with one FIFO per connection (fragment_bytes = 0, how every link worked
// before), both measured in the same run on loopback.
//
// A client transport sends one bulk request (`--bulk-mib`) to a server
// transport and, every `--probe-ms` until the bulk request is answered, a
// small probe request from another requester; the server answers each at
// once from its I/O thread. The link from client to server is shaped
// (`--link-profile`, 1 Gbit/s by default), as the failure detector's
// heartbeats would be. Reported: probe round trips (p50, p99, worst), the
// bulk message's time and rate, and the two ratios that matter: how much
// sooner probes are answered with fragments, and what fragmenting costs the
// bulk transfer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "net/codec.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::app {

namespace {

using bench_clock = std::chrono::steady_clock;

struct interleave_options {
  double bulk_mib = 256;
  std::string profile = "bw=1Gbit";
  std::size_t fragment_kib = net::transport_options{}.fragment_bytes / 1024;
  int probe_ms = 50;
  bool json = false;
};

struct run_figures {
  double bulk_s = 0, bulk_mb_s = 0;
  std::vector<double> probe_ms;  // sorted round trips of the probes sent during the bulk transfer
  double idle_probe_ms = 0;      // one probe on the idle link, before
  double p(double q) const {
    if (probe_ms.empty()) return 0;
    return probe_ms[static_cast<std::size_t>(q * static_cast<double>(probe_ms.size() - 1) + 0.5)];
  }
};

/// One client/server pair of transports with the given fragment size.
run_figures measure(const interleave_options& o, std::size_t fragment_bytes, const net::link_profile& profile) {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, bench_clock::time_point> sent;  // probe id -> send time
  std::vector<double> rtts;
  bool bulk_done = false;
  bench_clock::time_point bulk_at{};

  std::atomic<net::zmq_transport*> server_ptr{nullptr};
  net::transport_events server_events;
  server_events.on_message = [&server_ptr](net::connection_id c, net::message&& m) {
    net::message reply;
    reply.kind = net::message_kind::response;
    reply.correlation_id = m.correlation_id;
    reply.type = m.type;
    server_ptr.load()->send(c, reply);
  };
  auto options = [&](const std::string& id) {
    net::transport_options t;
    t.identity = id;
    t.fragment_bytes = fragment_bytes;
    return t;
  };
  auto server = net::zmq_transport::start(options("interleave-server"), std::move(server_events));
  if (!server) throw std::runtime_error("bench interleave: " + net::error_text(server.error()));
  server_ptr.store(server->get());

  net::transport_events client_events;
  client_events.on_message = [&](net::connection_id, net::message&& m) {
    const auto now = bench_clock::now();
    std::lock_guard<std::mutex> lock(mu);
    if (m.correlation_id == 1) {
      bulk_done = true;
      bulk_at = now;
    } else if (auto it = sent.find(m.correlation_id); it != sent.end()) {
      rtts.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
      sent.erase(it);
    }
    cv.notify_all();
  };
  auto client = net::zmq_transport::start(options("interleave-client"), std::move(client_events));
  if (!client) throw std::runtime_error("bench interleave: " + net::error_text(client.error()));
  const auto conn = (*client)->connect((*server)->endpoint());

  std::uint64_t next_probe = 2;
  auto probe = [&] {
    net::message m;
    m.kind = net::message_kind::request;
    m.type = "probe";
    m.correlation_id = next_probe++;
    std::lock_guard<std::mutex> lock(mu);
    sent[m.correlation_id] = bench_clock::now();
    if (!(*client)->send(conn, m)) throw std::runtime_error("bench interleave: the transport refused a probe");
  };
  auto wait_probes = [&](std::size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return rtts.size() >= n; }))
      throw std::runtime_error("bench interleave: a probe got no answer within 30 s");
  };
  // Warm up the connection unshaped, then one probe on the idle shaped link.
  probe();
  wait_probes(1);
  (*client)->set_profile(conn, profile);
  probe();
  wait_probes(2);
  run_figures f;
  f.idle_probe_ms = rtts.back();
  rtts.clear();

  net::message bulk;
  bulk.kind = net::message_kind::request;
  bulk.type = "bulk";
  bulk.sender_actor = "bulk-sender";
  bulk.target_actor = "sink";
  bulk.correlation_id = 1;
  bulk.tensors.push_back(Tensor::zeros({static_cast<std::int64_t>(o.bulk_mib * (1 << 20) / 4)}));
  const double bytes = static_cast<double>(bulk.tensors[0].nbytes());
  const auto t0 = bench_clock::now();
  if (!(*client)->send(conn, bulk)) throw std::runtime_error("bench interleave: the transport refused the bulk message");
  bulk = net::message();
  std::size_t probes = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, std::chrono::milliseconds(o.probe_ms), [&] { return bulk_done; })) break;
      if (bench_clock::now() - t0 > std::chrono::minutes(5))
        throw std::runtime_error("bench interleave: the bulk message got no answer within 5 minutes");
    }
    probe();
    ++probes;
  }
  wait_probes(probes);  // probes sent during the transfer, answered during or after it
  f.bulk_s = std::chrono::duration<double>(bulk_at - t0).count();
  f.bulk_mb_s = bytes / f.bulk_s / 1e6;
  f.probe_ms = rtts;
  std::sort(f.probe_ms.begin(), f.probe_ms.end());
  client->reset();
  server_ptr.store(nullptr);
  return f;
}

nlohmann::json figures_json(const run_figures& f) {
  return {{"bulk_s", f.bulk_s},
          {"bulk_mb_s", f.bulk_mb_s},
          {"idle_probe_ms", f.idle_probe_ms},
          {"probes", f.probe_ms.size()},
          {"probe_p50_ms", f.p(0.5)},
          {"probe_p99_ms", f.p(0.99)},
          {"probe_max_ms", f.probe_ms.empty() ? 0.0 : f.probe_ms.back()}};
}

int run_interleave(const interleave_options& o) {
  const net::link_profile profile = net::parse_link_profile(o.profile);
  if (o.fragment_kib < 4) throw std::invalid_argument("bench interleave: --fragment-kib must be at least 4");
  if (!o.json)
    std::fprintf(stderr, "bench interleave: %.0f MiB over %s, a probe every %d ms; measuring...\n", o.bulk_mib,
                 net::describe(profile).c_str(), o.probe_ms);
  const run_figures frag = measure(o, o.fragment_kib * 1024, profile);
  const run_figures fifo = measure(o, 0, profile);
  const double sooner = frag.p(0.5) > 0 ? fifo.p(0.5) / frag.p(0.5) : 0;
  const double cost = fifo.bulk_mb_s > 0 ? frag.bulk_mb_s / fifo.bulk_mb_s : 0;
  const bool latency_met = frag.p(0.5) <= 50;
  const bool rate_met = cost >= 0.9;
  nlohmann::json j{{"bench", "interleave"},
                   {"bulk_mib", o.bulk_mib},
                   {"profile", o.profile},
                   {"fragment_kib", o.fragment_kib},
                   {"probe_interval_ms", o.probe_ms},
                   {"fragments", figures_json(frag)},
                   {"fifo", figures_json(fifo)},
                   {"probe_p50_ratio_fifo_over_fragments", sooner},
                   {"bulk_rate_ratio_fragments_over_fifo", cost},
                   {"target_probe_p50_50ms_met", latency_met},
                   {"target_bulk_rate_90pct_met", rate_met}};
  if (!o.json) {
    std::printf("%-22s %10s %10s %8s %12s %12s %12s %12s\n", "path", "bulk s", "bulk MB/s", "probes", "idle ms",
                "probe p50", "probe p99", "probe max");
    auto row = [](const char* name, const run_figures& f) {
      std::printf("%-22s %10.3f %10.1f %8zu %12.2f %12.2f %12.2f %12.2f\n", name, f.bulk_s, f.bulk_mb_s,
                  f.probe_ms.size(), f.idle_probe_ms, f.p(0.5), f.p(0.99), f.probe_ms.empty() ? 0.0 : f.probe_ms.back());
    };
    row("fragments", frag);
    row("one FIFO (before)", fifo);
    std::printf("probes answered %.1fx sooner with fragments (p50); bulk rate with fragments %.3f of the FIFO's\n",
                sooner, cost);
    std::printf("targets: probe p50 <= 50 ms during the transfer: %s; bulk rate >= 90%% of the FIFO's: %s\n",
                latency_met ? "met" : "MISSED", rate_met ? "met" : "MISSED");
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_interleave(CLI::App* bench, action_fn& action) {
  static interleave_options o;
  auto* cmd = bench->add_subcommand(
      "interleave", "Small requests during a large transfer on one link: fragments vs one FIFO (loopback)");
  cmd->add_option("--bulk-mib", o.bulk_mib, "Size of the large message in MiB (at most 1024)")
      ->check(finite_between(0.001, 1024))
      ->capture_default_str();
  cmd->add_option("--link-profile", o.profile,
                  "Shaping of the client's link: none, ib, roce, ethernet, wan, consumer or \"bw=100Mbit,lat=20ms,...\"")
      ->capture_default_str();
  cmd->add_option("--fragment-kib", o.fragment_kib, "Fragment size of the fragmented run, KiB")->capture_default_str();
  cmd->add_option("--probe-ms", o.probe_ms, "Milliseconds between probes")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_flag("--json", o.json, "Print only the JSON result line");
  cmd->callback([&action] { action = [] { return run_interleave(o); }; });
}

}  // namespace corolla::app
