// corolla bench link — throughput and latency of the runtime's links next to
// raw ZeroMQ, both measured in the same run on loopback in this process.
//
//   raw:     a DEALER and a ROUTER (each with its own context, like two
//            nodes) exchanging plain zero-copy zmq messages; the ROUTER side
//            is a thread that echoes pings and acknowledges stream messages.
//   corolla: two zmq_transport instances: encode (XXH3 checksums), command
//            queue and eventfd hand-off to the I/O thread, decode with full
//            validation, the event handler, and back.
//
// Latency: one message in flight, round trip / 2, p50 and p99. Throughput:
// `size`-byte messages streamed with a window of unacknowledged messages
// (the same window for every path). Each path is a link_path, so another
// (e.g. through the actor layer) is one more subclass in paths().
#include <algorithm>
#include <charconv>
#include <cmath>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <zmq.h>

#include "apps/commands.hpp"
#include "apps/flag_checks.hpp"
#include "net/codec.hpp"
#include "net/rdma_fake.hpp"
#include "net/rdma_verbs.hpp"
#include "net/zmq_transport.hpp"

namespace corolla::app {

namespace {

using bench_clock = std::chrono::steady_clock;
constexpr auto reply_timeout = std::chrono::seconds(10);

double seconds_since(bench_clock::time_point t0) {
  return std::chrono::duration<double>(bench_clock::now() - t0).count();
}

/// Messages in flight while streaming: enough to keep the pipe busy, at most
/// 128 MB outstanding.
int stream_window(std::size_t size) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{128} << 20) / size, 2, 64));
}

/// When a measurement stops: after `count` messages or `seconds`, whichever
/// comes first, but never before `min_count` messages.
struct budget {
  int count;
  double seconds;
  int min_count;
};

/// One way of moving messages between two endpoints in this process.
class link_path {
 public:
  virtual ~link_path() = default;
  /// Column name ("raw", "corolla").
  virtual std::string name() const = 0;
  /// Sends one `size`-byte message and waits for its echo; returns when it is back.
  virtual void round_trip(std::size_t size) = 0;
  /// Sends one `size`-byte message that the far side acknowledges.
  virtual void send_stream(std::size_t size) = 0;
  /// Waits for the next acknowledgement of a stream message.
  virtual void wait_ack() = 0;

  /// One-way latencies (round trip / 2) in microseconds.
  std::vector<double> latencies(std::size_t size, const budget& b) {
    for (int i = 0; i < 3; ++i) round_trip(size);  // warm up connection and allocator
    std::vector<double> us;
    const auto start = bench_clock::now();
    while (static_cast<int>(us.size()) < b.count &&
           (static_cast<int>(us.size()) < b.min_count || seconds_since(start) < b.seconds)) {
      const auto t0 = bench_clock::now();
      round_trip(size);
      us.push_back(std::chrono::duration<double, std::micro>(bench_clock::now() - t0).count() / 2);
    }
    std::sort(us.begin(), us.end());
    return us;
  }

  /// Payload bytes per second streaming `size`-byte messages.
  double throughput(std::size_t size, const budget& b) {
    const int window = stream_window(size);
    for (int i = 0; i < window; ++i) send_stream(size);  // warm up
    for (int i = 0; i < window; ++i) wait_ack();
    int sent = 0, acked = 0, target = b.count;
    const auto start = bench_clock::now();
    while (acked < target) {
      while (sent < target && sent - acked < window) {
        send_stream(size);
        ++sent;
      }
      wait_ack();
      ++acked;
      if (acked >= b.min_count && seconds_since(start) >= b.seconds) target = sent;  // drain and stop
    }
    return static_cast<double>(acked) * static_cast<double>(size) / seconds_since(start);
  }
};

// ---- raw ZeroMQ -----------------------------------------------------------------

void check_zmq(int rc, const char* what) {
  if (rc < 0) throw std::runtime_error(std::string("bench link: ") + what + ": " + zmq_strerror(zmq_errno()));
}

class raw_zmq_path final : public link_path {
 public:
  raw_zmq_path() {
    server_ctx_ = zmq_ctx_new();
    client_ctx_ = zmq_ctx_new();
    router_ = zmq_socket(server_ctx_, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(router_, ZMQ_LINGER, &zero, sizeof zero);
    check_zmq(zmq_bind(router_, "tcp://127.0.0.1:0"), "bind");
    char endpoint[256];
    std::size_t len = sizeof endpoint;
    check_zmq(zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, endpoint, &len), "ZMQ_LAST_ENDPOINT");
    dealer_ = zmq_socket(client_ctx_, ZMQ_DEALER);
    zmq_setsockopt(dealer_, ZMQ_LINGER, &zero, sizeof zero);
    const int timeout_ms = static_cast<int>(std::chrono::milliseconds(reply_timeout).count());
    zmq_setsockopt(dealer_, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms);
    check_zmq(zmq_connect(dealer_, endpoint), "connect");
    server_ = std::thread([this] { serve(); });
  }
  ~raw_zmq_path() override {
    zmq_send(dealer_, "Q", 1, 0);
    server_.join();
    zmq_close(dealer_);
    zmq_close(router_);
    zmq_ctx_term(client_ctx_);
    zmq_ctx_term(server_ctx_);
  }
  std::string name() const override { return "raw"; }

  void round_trip(std::size_t size) override {
    send_payload('P', size);
    receive_reply();
  }
  void send_stream(std::size_t size) override { send_payload('S', size); }
  void wait_ack() override { receive_reply(); }

 private:
  void send_payload(char kind, std::size_t size) {
    if (payload_.size() < size) payload_.assign(size, 0x5a);
    check_zmq(zmq_send(dealer_, &kind, 1, ZMQ_SNDMORE), "send");
    zmq_msg_t msg;
    // Constant data, no free function: ZeroMQ sends it without copying,
    // as the transport does with tensors.
    zmq_msg_init_data(&msg, payload_.data(), size, nullptr, nullptr);
    const int rc = zmq_msg_send(&msg, dealer_, 0);
    if (rc < 0) zmq_msg_close(&msg);
    check_zmq(rc, "send");
  }
  void receive_reply() {
    bool more = true;
    while (more) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      const int rc = zmq_msg_recv(&msg, dealer_, 0);
      more = rc >= 0 && zmq_msg_more(&msg);
      zmq_msg_close(&msg);
      if (rc < 0) throw std::runtime_error("bench link: raw ZeroMQ: no reply within 10 s");
    }
  }
  /// The far side: echoes 'P' messages, acknowledges 'S' ones, stops at 'Q'.
  void serve() {
    while (true) {
      zmq_msg_t parts[3];
      for (auto& part : parts) zmq_msg_init(&part);
      int n = 0;
      bool more = true;
      while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, router_, 0) < 0) {
          zmq_msg_close(&part);
          for (auto& p : parts) zmq_msg_close(&p);
          return;
        }
        more = zmq_msg_more(&part);
        if (n < 3) zmq_msg_move(&parts[n++], &part);
        zmq_msg_close(&part);
      }
      const char kind = n > 1 && zmq_msg_size(&parts[1]) > 0 ? *static_cast<char*>(zmq_msg_data(&parts[1])) : '?';
      if (kind == 'P' && n == 3) {
        zmq_msg_send(&parts[0], router_, ZMQ_SNDMORE);
        zmq_msg_send(&parts[1], router_, ZMQ_SNDMORE);
        zmq_msg_send(&parts[2], router_, 0);  // the received buffer goes back as it is
      } else if (kind == 'S') {
        zmq_msg_send(&parts[0], router_, ZMQ_SNDMORE);
        zmq_send(router_, "A", 1, 0);
      }
      for (auto& part : parts) zmq_msg_close(&part);
      if (kind == 'Q') return;
    }
  }

  void* server_ctx_ = nullptr;
  void* client_ctx_ = nullptr;
  void* router_ = nullptr;
  void* dealer_ = nullptr;
  std::thread server_;
  std::vector<unsigned char> payload_;
};

// ---- the runtime's link -------------------------------------------------------------

class transport_path final : public link_path {
 public:
  /// With `rdma` (one device per side) the connection is moved to RDMA
  /// before measuring.
  transport_path(const net::link_profile& profile, bool checksums, int busy_poll_us, std::size_t fragment_bytes,
                 std::pair<std::shared_ptr<net::rdma::device>, std::shared_ptr<net::rdma::device>> rdma = {})
      : name_(rdma.first ? "rdma" : "corolla") {
    auto options = [&](const std::string& id, std::shared_ptr<net::rdma::device> dev) {
      net::transport_options o;
      o.identity = id;
      o.busy_poll_us = busy_poll_us;
      o.fragment_bytes = fragment_bytes;
      o.rdma_device = std::move(dev);
      o.default_profile = profile;
      o.send_checksums = checksums;
      o.limits.verify_checksums = checksums;
      return o;
    };
    // The far side echoes pings and acknowledges stream messages from its
    // I/O thread, as an actor's link would answer.
    net::transport_events server_events;
    server_events.on_message = [this](net::connection_id c, net::message&& m) {
      net::message reply;
      reply.kind = net::message_kind::response;
      reply.correlation_id = m.correlation_id;
      reply.type = m.type;
      if (m.type == "ping") reply.tensors = std::move(m.tensors);
      server_ptr_.load()->send(c, reply);
    };
    auto server = net::zmq_transport::start(options("bench-server", rdma.first), std::move(server_events));
    if (!server) throw std::runtime_error("bench link: " + net::error_text(server.error()));
    server_ = std::move(*server);
    server_ptr_.store(server_.get());

    net::transport_events client_events;
    client_events.on_message = [this](net::connection_id, net::message&&) {
      std::lock_guard<std::mutex> lock(mu_);
      ++replies_;
      cv_.notify_one();
    };
    client_events.on_rdma = [this](net::connection_id, bool up, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu_);
      rdma_state_ = up ? 1 : -1;
      rdma_reason_ = why;
      cv_.notify_one();
    };
    auto client = net::zmq_transport::start(options("bench-client", rdma.second), std::move(client_events));
    if (!client) throw std::runtime_error("bench link: " + net::error_text(client.error()));
    client_ = std::move(*client);
    conn_ = client_->connect(server_->endpoint());
    if (rdma.first) {
      // A peer takes an offer only after a first message (the hello, for
      // nodes): one round trip first.
      send_typed("ping", 4);
      wait_ack();
      client_->offer_rdma(conn_);
      std::unique_lock<std::mutex> lock(mu_);
      if (!cv_.wait_for(lock, reply_timeout, [&] { return rdma_state_ != 0; }))
        throw std::runtime_error("bench link: the RDMA offer got no answer within 10 s");
      if (rdma_state_ < 0) throw std::runtime_error("bench link: the connection did not move to RDMA: " + rdma_reason_);
    }
  }
  std::string name() const override { return name_; }

  void round_trip(std::size_t size) override {
    send_typed("ping", size);
    wait_ack();
  }
  void send_stream(std::size_t size) override { send_typed("stream", size); }
  void wait_ack() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, reply_timeout, [&] { return replies_ > 0; }))
      throw std::runtime_error("bench link: corolla transport: no reply within 10 s");
    --replies_;
  }

 private:
  void send_typed(const char* type, std::size_t size) {
    if (!payload_.defined() || payload_.nbytes() != size)
      payload_ = Tensor::zeros({static_cast<std::int64_t>(size / 4)});
    net::message m;
    m.kind = net::message_kind::request;
    m.type = type;
    m.correlation_id = ++sequence_;
    m.tensors.push_back(payload_);  // shares the storage: sent without copying
    const auto deadline = bench_clock::now() + reply_timeout;
    while (!client_->send(conn_, m)) {  // false only while the queue is full
      if (bench_clock::now() > deadline) throw std::runtime_error("bench link: corolla transport refused sends for 10 s");
      std::this_thread::yield();
    }
  }

  std::unique_ptr<net::zmq_transport> server_, client_;
  std::atomic<net::zmq_transport*> server_ptr_{nullptr};  // read by the server's I/O thread
  net::connection_id conn_ = 0;
  Tensor payload_;
  std::uint64_t sequence_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  int replies_ = 0;
  int rdma_state_ = 0;  // 1 up, -1 refused
  std::string rdma_reason_;
  std::string name_;
};

// ---- the command ------------------------------------------------------------------

struct link_options {
  std::string sizes = "4096,1048576,67108864";
  int count = 2000;
  double seconds = 1.0;
  std::string profile = "none";
  bool no_checksums = false;
  int busy_poll_us = net::transport_options{}.busy_poll_us;
  std::size_t fragment_kib = net::transport_options{}.fragment_bytes / 1024;
  int rounds = 3;
  std::string rdma;  // "", "fake", or a verbs device name / "auto"
  bool json = false;
};

std::vector<std::size_t> parse_sizes(const std::string& text) {
  std::vector<std::size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t pos = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    if (pos != item.size() || v < 4 || v % 4 != 0 || v > (1ull << 30))
      throw std::invalid_argument("bench link: --sizes: \"" + item +
                                  "\" is not a byte count that is a multiple of 4 in [4, 1 GiB]");
    sizes.push_back(v);
  }
  if (sizes.empty()) throw std::invalid_argument("bench link: --sizes is empty");
  return sizes;
}

std::string size_label(std::size_t s) {
  char buf[32];
  if (s >= (1u << 20) && s % (1u << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", s >> 20);
  else if (s >= 1024 && s % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", s >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", s);
  return buf;
}

struct path_figures {
  double mb_per_s = 0;
  double p50_us = 0, p99_us = 0;
  std::size_t samples = 0;
};

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(i, sorted.size() - 1)];
}

int run_link(const link_options& o) {
  const auto sizes = parse_sizes(o.sizes);
  if (o.count < 1 || !(o.seconds > 0) || !std::isfinite(o.seconds)) throw std::invalid_argument("bench link: need --count >= 1 and --seconds > 0");
  if (o.rounds < 1) throw std::invalid_argument("bench link: need --rounds >= 1");
  const net::link_profile profile = net::parse_link_profile(o.profile);
  const bool checksums = !o.no_checksums;

  std::vector<std::unique_ptr<link_path>> paths;
  paths.push_back(std::make_unique<raw_zmq_path>());
  paths.push_back(std::make_unique<transport_path>(profile, checksums, o.busy_poll_us, o.fragment_kib * 1024));
  std::string rdma_label;
  if (!o.rdma.empty()) {
    std::pair<std::shared_ptr<net::rdma::device>, std::shared_ptr<net::rdma::device>> devs;
    if (o.rdma == "fake") {
      auto fabric = net::rdma::fake_fabric::create();
      devs = {fabric->open_device(), fabric->open_device()};
      rdma_label = "fake fabric (in-process memcpy: the protocol's cost, not a NIC's)";
    } else {
      const std::string name = o.rdma == "auto" ? "" : o.rdma;
      devs = {net::rdma::open_verbs_device(name), net::rdma::open_verbs_device(name)};  // throws why not
      rdma_label = devs.first->name() + " (loopback through the HCA)";
    }
    paths.push_back(std::make_unique<transport_path>(profile, checksums, o.busy_poll_us, o.fragment_kib * 1024, devs));
  }
  if (!o.json)
    std::fprintf(stderr,
                 "bench link: loopback, %u hardware threads, profile %s, checksums %s, busy poll %d us, "
                 "fragments %zu KiB; measuring...\n",
                 std::thread::hardware_concurrency(), net::describe(profile).c_str(), checksums ? "on" : "off",
                 o.busy_poll_us, o.fragment_kib);
  if (!o.json && !rdma_label.empty()) std::fprintf(stderr, "bench link: rdma path on %s\n", rdma_label.c_str());

  // figures[size][path]
  std::vector<std::vector<path_figures>> figures(sizes.size(), std::vector<path_figures>(paths.size()));
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    const std::size_t size = sizes[s];
    const budget b{o.count, o.seconds, std::min(o.count, 5)};
    // The paths take turns, --rounds times, so both see the same conditions
    // (a shared VM's speed drifts within seconds). Latency samples of all
    // rounds are pooled; throughput is the median of the rounds.
    std::vector<std::vector<double>> lat(paths.size()), rates(paths.size());
    for (int round = 0; round < o.rounds; ++round)
      for (std::size_t p = 0; p < paths.size(); ++p) {
        auto l = paths[p]->latencies(size, b);
        lat[p].insert(lat[p].end(), l.begin(), l.end());
        rates[p].push_back(paths[p]->throughput(size, b) / 1e6);
      }
    for (std::size_t p = 0; p < paths.size(); ++p) {
      std::sort(lat[p].begin(), lat[p].end());
      std::sort(rates[p].begin(), rates[p].end());
      figures[s][p].p50_us = percentile(lat[p], 0.5);
      figures[s][p].p99_us = percentile(lat[p], 0.99);
      figures[s][p].samples = lat[p].size();
      figures[s][p].mb_per_s = percentile(rates[p], 0.5);
    }
  }

  nlohmann::json results = nlohmann::json::array();
  bool throughput_met = true, latency_met = true;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    nlohmann::json r = {{"size", sizes[s]}};
    const auto& raw = figures[s][0];
    for (std::size_t p = 0; p < paths.size(); ++p) {
      const auto& f = figures[s][p];
      nlohmann::json e = {{"mb_per_s", f.mb_per_s}, {"latency_p50_us", f.p50_us},
                          {"latency_p99_us", f.p99_us}, {"latency_samples", f.samples}};
      if (p > 0) {
        e["throughput_ratio"] = raw.mb_per_s > 0 ? f.mb_per_s / raw.mb_per_s : 0;
        e["added_latency_us"] = f.p50_us - raw.p50_us;
      }
      r[paths[p]->name()] = e;
    }
    const auto& corolla = figures[s][1];
    if (sizes[s] >= (1u << 20) && corolla.mb_per_s < 0.9 * raw.mb_per_s) throughput_met = false;
    if (sizes[s] <= 4096 && corolla.p50_us - raw.p50_us > 50) latency_met = false;
    results.push_back(r);
  }
  nlohmann::json j = {{"bench", "link"},
                      {"transport", "tcp loopback"},
                      {"hardware_threads", std::thread::hardware_concurrency()},
                      {"profile", o.profile},
                      {"checksums", checksums},
                      {"busy_poll_us", o.busy_poll_us},
                      {"fragment_kib", o.fragment_kib},
                      {"rounds", o.rounds},
                      {"rdma", o.rdma.empty() ? nlohmann::json(nullptr) : nlohmann::json(rdma_label)},
                      {"results", results}};
  if (profile.unshaped()) {
    j["target_throughput_90pct_of_raw_met"] = throughput_met;
    j["target_added_latency_50us_met"] = latency_met;
  }

  if (!o.json) {
    // MB = 10^6 bytes; latency = round trip / 2 of one message in flight.
    std::printf("%9s", "size");
    for (std::size_t p = 0; p < paths.size(); ++p) {
      std::printf(" %12s", (paths[p]->name() + " MB/s").c_str());
      if (p > 0) std::printf(" %6s", "ratio");
    }
    for (std::size_t p = 0; p < paths.size(); ++p) {
      std::printf(" %19s", (paths[p]->name() + " us p50/p99").c_str());
      if (p > 0) std::printf(" %9s", "added us");
    }
    std::printf("\n");
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      const auto& raw = figures[s][0];
      std::printf("%9s", size_label(sizes[s]).c_str());
      for (std::size_t p = 0; p < paths.size(); ++p) {
        std::printf(" %12.1f", figures[s][p].mb_per_s);
        if (p > 0) std::printf(" %6.3f", raw.mb_per_s > 0 ? figures[s][p].mb_per_s / raw.mb_per_s : 0.0);
      }
      for (std::size_t p = 0; p < paths.size(); ++p) {
        char lat[40];
        std::snprintf(lat, sizeof lat, "%.1f / %.1f", figures[s][p].p50_us, figures[s][p].p99_us);
        std::printf(" %19s", lat);
        if (p > 0) std::printf(" %9.1f", figures[s][p].p50_us - raw.p50_us);
      }
      std::printf("\n");
    }
    if (profile.unshaped())
      std::printf("targets: >= 90%% of raw throughput for >= 1 MiB: %s; <= 50 us added latency for <= 4 KiB: %s\n",
                  throughput_met ? "met" : "MISSED", latency_met ? "met" : "MISSED");
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

void register_bench_link(CLI::App* bench, action_fn& action) {
  static link_options o;
  auto* link = bench->add_subcommand("link", "Throughput and latency of the runtime's links vs raw ZeroMQ (loopback)");
  link->add_option("--sizes", o.sizes, "Message sizes in bytes, comma-separated")->capture_default_str();
  link->add_option("--count", o.count, "Most messages per measurement")->capture_default_str();
  link->add_option("--seconds", o.seconds, "Most seconds per measurement (at least 5 messages)")
      ->capture_default_str();
  link->add_option("--link-profile", o.profile,
                   "Shaping of the corolla links: none, ib, roce, ethernet, wan, consumer or "
                   "\"bw=100Mbit,lat=20ms,...\"")
      ->capture_default_str();
  link->add_flag("--no-checksums", o.no_checksums, "Send and accept tensor frames without XXH3 checksums");
  link->add_option("--busy-poll-us", o.busy_poll_us,
                   "Microseconds the transports' I/O threads keep polling after activity before sleeping")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  link->add_option("--fragment-kib", o.fragment_kib,
                   "Fragment size of the corolla links in KiB (0: never fragment, one FIFO per connection)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            std::size_t n = 0;
            const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
            if (ec != std::errc() || end != v.data() + v.size() || (n != 0 && (n < 4 || n > 1048576)))
              return std::string("must be 0 or a whole number from 4 to 1048576 (1 GiB), got '" + v + "'");
            return std::string();
          },
          "0 or 4 to 1048576"));
  link->add_option("--rounds", o.rounds,
                   "Times the two paths take turns per size (latency pooled, throughput median)")
      ->capture_default_str()
      ->check(finite_above(0));
  link->add_option("--rdma", o.rdma,
                   "Also measure the RDMA path: 'fake' (in-process fabric: protocol cost only), 'auto' (first "
                   "active verbs port) or a verbs device name");
  link->add_flag("--json", o.json, "Print only the JSON result line");
  link->callback([&action] { action = [] { return run_link(o); }; });
}

}  // namespace corolla::app
