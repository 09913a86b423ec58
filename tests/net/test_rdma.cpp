// tests/net/test_rdma.cpp — the RDMA transport's protocol on the in-process
// fake fabric (net/rdma_fake.hpp): the channel (eager and rendezvous
// messages, credits, order, bad headers, failures) and the transport's
// upgrade of a ZeroMQ connection to RDMA and back. No RDMA hardware runs
// here; open_verbs_device's refusal is checked as this machine gives it.
#include <atomic>
#include <deque>
#include <cstring>
#include <thread>

#include <doctest/doctest.h>

#include "net/codec.hpp"
#include "net/rdma_channel.hpp"
#include "net/rdma_fake.hpp"
#include "net/rdma_link.hpp"
#include "net/rdma_verbs.hpp"
#include "net/zmq_transport.hpp"
#include "transport_recorder.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::testing;

namespace {

/// A tensor of n f32 values that differ from one message to the next.
Tensor pattern(std::int64_t n, float seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = seed + 0.5f * static_cast<float>(i % 1000) - 0.001f * static_cast<float>(i);
  return Tensor::from_f32(v, {n});
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

/// Two channels connected to each other on one fake fabric.
struct channel_pair {
  std::shared_ptr<rdma::fake_fabric> fabric = rdma::fake_fabric::create();
  std::shared_ptr<rdma::device> dev = fabric->open_device();
  rdma::channel a{dev->create_queue_pair(512), decode_limits{}, true};
  rdma::channel b{dev->create_queue_pair(512), decode_limits{}, true};
  std::vector<message> got_a, got_b;
  std::vector<std::string> bad_a, bad_b;

  channel_pair() {
    a.connect(b.local_address());
    b.connect(a.local_address());
  }
  /// Progresses both sides until `done` or 20000 rounds; false if a channel failed.
  bool pump(const std::function<bool()>& done) {
    for (int i = 0; i < 20000 && !done(); ++i) {
      const bool ok_a = a.progress([&](message&& m) { got_a.push_back(std::move(m)); },
                                   [&](const std::string& r) { bad_a.push_back(r); });
      const bool ok_b = b.progress([&](message&& m) { got_b.push_back(std::move(m)); },
                                   [&](const std::string& r) { bad_b.push_back(r); });
      if (!ok_a || !ok_b) return false;
    }
    return done();
  }
};

}  // namespace

TEST_CASE("rdma channel: eager and rendezvous messages arrive bit-exact, in order, and rendezvous memory is released") {
  channel_pair p;
  const Tensor small = pattern(100, 1), large = pattern(3 << 20, 2);  // 12 MiB: two 8 MiB READs
  p.a.send(make_message(message_kind::oneway, 1, {small}));
  p.a.send(make_message(message_kind::request, 2, {large, small}));
  p.a.send(make_message(message_kind::oneway, 3, {}));
  REQUIRE(p.pump([&] { return p.got_b.size() == 3 && p.a.idle() && p.b.idle(); }));
  CHECK(p.got_b[0].correlation_id == 1);
  CHECK(p.got_b[1].correlation_id == 2);
  CHECK(p.got_b[2].correlation_id == 3);
  REQUIRE(p.got_b[0].tensors.size() == 1);
  CHECK(same_bytes(p.got_b[0].tensors[0], small));
  REQUIRE(p.got_b[1].tensors.size() == 2);
  CHECK(same_bytes(p.got_b[1].tensors[0], large));
  CHECK(same_bytes(p.got_b[1].tensors[1], small));
  CHECK(p.got_b[1].body == std::vector<std::uint8_t>{1, 2, 3, 4, 5});
  // The READ target buffers are 64-byte aligned and adopted, not copied again.
  CHECK(reinterpret_cast<std::uintptr_t>(p.got_b[1].tensors[0].raw()) % 64 == 0);
  const auto sa = p.a.stats();
  CHECK(sa.eager_sent == 2);
  CHECK(sa.rendezvous_sent == 1);
  const auto f = p.fabric->stats();
  CHECK(f.reads == 4);  // the envelope, two 8 MiB chunks of the large frame, the small tensor
  CHECK(f.read_bytes >= large.nbytes());
}

TEST_CASE("rdma channel: thousands of messages both ways never find the peer without a posted receive") {
  channel_pair p;
  constexpr int n = 3000;
  const Tensor t = pattern(64, 3);
  int sent_a = 0, sent_b = 0;
  // Bursts far beyond the 64 receive slots: the fake fails any SEND that
  // finds no receive posted, so credits must hold them back.
  REQUIRE(p.pump([&] {
    for (int k = 0; k < 200 && sent_a < n; ++k) p.a.send(make_message(message_kind::oneway, ++sent_a, {t}));
    for (int k = 0; k < 150 && sent_b < n; ++k) p.b.send(make_message(message_kind::oneway, ++sent_b, {}));
    return p.got_b.size() == n && p.got_a.size() == n;
  }));
  for (int i = 0; i < n; ++i) {
    REQUIRE(p.got_b[static_cast<std::size_t>(i)].correlation_id == static_cast<std::uint64_t>(i + 1));
    REQUIRE(p.got_a[static_cast<std::size_t>(i)].correlation_id == static_cast<std::uint64_t>(i + 1));
  }
  CHECK(same_bytes(p.got_b.back().tensors.at(0), t));
  CHECK(p.bad_a.empty());
  CHECK(p.bad_b.empty());
}

TEST_CASE("rdma channel: garbage, lying frame tables and oversized rendezvous are refused and the channel goes on") {
  auto fabric = rdma::fake_fabric::create();
  auto dev = fabric->open_device();
  decode_limits limits;
  limits.max_tensor_bytes = 1 << 20;
  rdma::channel ch{dev->create_queue_pair(512), limits, true};
  auto raw = dev->create_queue_pair(64);  // a peer that sends whatever it likes
  ch.connect(raw->local_address());
  raw->connect(ch.local_address());
  std::vector<std::uint8_t> area(1 << 16), inbox(4 * 65536);
  const auto keys = raw->register_memory(area.data(), area.size(), 0);
  const auto in_keys = raw->register_memory(inbox.data(), inbox.size(), rdma::local_write);
  for (int i = 0; i < 4; ++i) raw->post_recv(100 + i, inbox.data() + i * 65536, 65536, in_keys.lkey);

  auto put = [&](std::size_t at, auto v) { std::memcpy(area.data() + at, &v, sizeof v); };
  auto header = [&](std::uint8_t kind, std::uint32_t nframes, std::uint64_t id) {
    std::fill(area.begin(), area.end(), 0);
    put(0, std::uint32_t{0x31445243});
    area[4] = kind;
    put(12, nframes);
    put(16, id);
  };
  std::vector<message> got;
  std::vector<std::string> bad;
  auto progress = [&] {
    for (int i = 0; i < 10; ++i)
      REQUIRE(ch.progress([&](message&& m) { got.push_back(std::move(m)); },
                          [&](const std::string& r) { bad.push_back(r); }));
  };

  std::memcpy(area.data(), "garbage!!", 9);  // no header
  raw->post_send(1, area.data(), 9, keys.lkey);
  progress();
  REQUIRE(bad.size() == 1);
  CHECK(bad[0].find("without a valid header") != std::string::npos);

  header(1, 2, 0);  // eager, 2 frames whose sizes claim more than was sent
  put(24, std::uint64_t{100});
  put(32, std::uint64_t{1u << 30});
  raw->post_send(2, area.data(), 40 + 100, keys.lkey);
  progress();
  REQUIRE(bad.size() == 2);
  CHECK(bad[1].find("do not add up") != std::string::npos);

  header(2, 2, 77);  // rendezvous with a tensor frame over max_tensor_bytes
  put(24, std::uint64_t{64});
  put(48, std::uint64_t{8u << 20});
  raw->post_send(3, area.data(), 24 + 48, keys.lkey);
  progress();
  REQUIRE(bad.size() == 3);
  CHECK(bad[2].find("over the limit") != std::string::npos);
  // The refused rendezvous is still answered with a FIN, so the sender can
  // release its memory.
  rdma::completion c[8];
  bool fin = false;
  for (int i = 0; i < 10 && !fin; ++i) {
    const int n = raw->poll(c, 8);
    for (int k = 0; k < n; ++k)
      if (c[k].what == rdma::completion::op::recv && c[k].ok && inbox[(c[k].wr_id - 100) * 65536 + 4] == 3)
        fin = true;  // kind 3 = FIN
  }
  CHECK(fin);
  CHECK(got.empty());
  CHECK_FALSE(ch.failed());
}

TEST_CASE("rdma channel: a message whose rendezvous table cannot fit a slot is dropped at the sender") {
  channel_pair p;
  std::vector<Tensor> many;
  for (int i = 0; i < 2800; ++i) many.push_back(pattern(4, static_cast<float>(i)));
  p.a.send(make_message(message_kind::oneway, 1, many));
  p.a.send(make_message(message_kind::oneway, 2));
  REQUIRE(p.pump([&] { return p.got_b.size() == 1; }));
  CHECK(p.got_b[0].correlation_id == 2);
  CHECK(p.a.stats().dropped == 1);
}

TEST_CASE("rdma channel: a failed work request fails the channel with the device's error") {
  channel_pair p;
  p.fabric->fail_all("transport retry counter exceeded");
  p.a.send(make_message(message_kind::oneway, 1, {pattern(10, 1)}));
  CHECK_FALSE(p.pump([] { return false; }));
  CHECK(p.a.failed());
  CHECK(p.a.failure().find("transport retry counter exceeded") != std::string::npos);
}

TEST_CASE("rdma: the queue pair address survives its encoding and a wrong size is refused") {
  rdma::qp_address a;
  a.qpn = 0x123456;
  a.psn = 0xABCDEF;
  a.lid = 77;
  a.port = 2;
  a.mtu = 5;
  for (int i = 0; i < 16; ++i) a.gid[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i * 13);
  a.max_read_size = 1u << 30;
  const auto bytes = a.encode();
  const auto b = rdma::qp_address::decode(bytes.data(), bytes.size());
  CHECK(b.qpn == a.qpn);
  CHECK(b.psn == a.psn);
  CHECK(b.lid == a.lid);
  CHECK(b.port == a.port);
  CHECK(b.mtu == a.mtu);
  CHECK(b.gid == a.gid);
  CHECK(b.max_read_size == a.max_read_size);
  CHECK_THROWS_AS(rdma::qp_address::decode(bytes.data(), bytes.size() - 1), std::invalid_argument);
}

TEST_CASE("rdma: opening a verbs device on this machine says why it cannot") {
  try {
    auto dev = rdma::open_verbs_device();
    MESSAGE("an RDMA device is present: " << dev->name());
  } catch (const std::runtime_error& e) {
    const std::string why = e.what();
    CHECK(why.find("links use TCP") != std::string::npos);
  }
}

TEST_CASE("rdma link: messages that overtake the peer's switch marker are held until it arrives") {
  auto fabric = rdma::fake_fabric::create();
  std::deque<message> to_a, to_b;  // control messages in flight over "ZeroMQ"
  std::vector<message> got_a, got_b;
  std::vector<std::pair<bool, std::string>> changes_a, changes_b;
  auto hooks = [](std::deque<message>& out, std::vector<message>& got, std::vector<std::pair<bool, std::string>>& ch) {
    rdma::link::hooks h;
    h.send_control = [&out](message&& m) { out.push_back(std::move(m)); };
    h.deliver = [&got](message&& m) { got.push_back(std::move(m)); };
    h.bad = [](const std::string& r) { FAIL("bad RDMA message: " << r); };
    h.changed = [&ch](bool up, const std::string& why) { ch.emplace_back(up, why); };
    return h;
  };
  rdma::link a(fabric->open_device(), {}, true, hooks(to_b, got_a, changes_a));
  rdma::link b(fabric->open_device(), {}, true, hooks(to_a, got_b, changes_b));
  auto deliver_one = [](std::deque<message>& q, rdma::link& l, const char* type) {
    REQUIRE_FALSE(q.empty());
    CHECK(q.front().type == type);
    CHECK(rdma::link::is_control(q.front()));
    l.on_control(q.front());
    q.pop_front();
  };
  auto progress = [&] {
    for (int i = 0; i < 10; ++i) {
      REQUIRE(a.progress());
      REQUIRE(b.progress());
    }
  };

  a.offer();
  deliver_one(to_b, b, "rdma.offer");
  CHECK_FALSE(b.sending());  // the acceptor waits for the connector's marker
  deliver_one(to_a, a, "rdma.accept");
  CHECK(a.sending());
  REQUIRE(changes_a.size() == 1);
  CHECK(changes_a[0].first);

  a.send(encode(make_message(message_kind::oneway, 1, {pattern(100000, 1)})));  // rendezvous
  a.send(encode(make_message(message_kind::oneway, 2)));                        // eager
  progress();
  CHECK(got_b.empty());  // arrived over RDMA before "rdma.ready": held
  deliver_one(to_b, b, "rdma.ready");
  REQUIRE(got_b.size() == 2);
  CHECK(got_b[0].correlation_id == 1);
  CHECK(got_b[1].correlation_id == 2);
  CHECK(b.sending());

  b.send(encode(make_message(message_kind::oneway, 3)));
  progress();
  CHECK(got_a.empty());  // held until "rdma.switch"
  deliver_one(to_a, a, "rdma.switch");
  REQUIRE(got_a.size() == 1);
  CHECK(got_a[0].correlation_id == 3);
  CHECK(a.messages_sent() == 2);
  CHECK(b.messages_received() == 2);

  // Without a device the link refuses offers and says why.
  rdma::link none(nullptr, {}, true, hooks(to_b, got_a, changes_a));
  none.offer();
  CHECK_FALSE(changes_a.back().first);
  CHECK(changes_a.back().second == "this node has no RDMA device");
  message offer;
  offer.kind = message_kind::oneway;
  offer.type = "rdma.offer";
  offer.body = rdma::qp_address{}.encode();
  none.on_control(offer);
  CHECK(to_b.back().type == "rdma.refuse");

  // A breaks: it tells B (rdma.down over "ZeroMQ"); B delivers what its
  // queue pair still holds, then falls back too. Both report a loss.
  to_b.clear();
  CHECK_FALSE(a.take_failure());
  fabric->fail_all("transport retry counter exceeded");
  a.send(encode(make_message(message_kind::oneway, 4)));
  bool ok = true;
  for (int i = 0; i < 5 && ok; ++i) ok = a.progress();  // the SEND fails when the fabric runs it
  CHECK_FALSE(ok);
  CHECK_FALSE(a.sending());
  CHECK(a.take_failure());
  CHECK_FALSE(a.take_failure());  // reported once
  fabric->fail_all("");
  REQUIRE(to_b.size() == 1);
  CHECK(to_b.front().type == "rdma.down");
  b.on_control(to_b.front());
  CHECK_FALSE(b.sending());
  CHECK(b.take_failure());
  CHECK(changes_b.back().second.find("the peer's RDMA path failed") != std::string::npos);
  // No new offer on this TCP connection; after its reset there may be one.
  a.offer();
  CHECK(changes_a.back().second.find("failed earlier") != std::string::npos);
  a.reset();
  to_b.clear();
  a.offer();
  REQUIRE(to_b.size() == 1);
  CHECK(to_b.front().type == "rdma.offer");
}

// ---- the transport's upgrade -----------------------------------------------------

namespace {

struct rdma_pair {
  std::shared_ptr<rdma::fake_fabric> fabric = rdma::fake_fabric::create();
  transport_recorder r1, r2;
  std::unique_ptr<zmq_transport> t1, t2;
  connection_id c21 = 0;  // t2's connection to t1
  connection_id c12 = 0;  // t1's connection for t2

  explicit rdma_pair(bool listener_has_device = true) {
    auto o1 = loopback_options("listener");
    if (listener_has_device) o1.rdma_device = fabric->open_device();
    t1 = start_transport(o1, r1);
    auto o2 = loopback_options("dialer");
    o2.listen = "";
    o2.rdma_device = fabric->open_device();
    t2 = start_transport(o2, r2);
    c21 = t2->connect(t1->endpoint());
    REQUIRE(t2->send(c21, make_message(message_kind::oneway, 0)));
    REQUIRE(r1.wait_messages(1));
    std::lock_guard<std::mutex> lock(r1.mu);
    c12 = r1.messages[0].conn;
  }
  static bool rdma_up(transport_recorder& r) {
    for (const auto& e : r.rdma_events)
      if (e.up) return true;
    return false;
  }
};

}  // namespace

TEST_CASE("transport: offer_rdma moves a busy connection to RDMA without losing or reordering a message") {
  rdma_pair p;
  constexpr int n = 400;
  // Both sides stream while the connection changes path under them; every
  // 40th message carries 2 MiB (rendezvous), the rest 1 KiB (eager).
  auto stream = [&](zmq_transport& t, connection_id c) {
    for (int i = 1; i <= n; ++i) {
      const Tensor payload = pattern(i % 40 == 0 ? (1 << 19) : 256, static_cast<float>(i));
      while (!t.send(c, make_message(message_kind::oneway, static_cast<std::uint64_t>(i), {payload})))
        std::this_thread::sleep_for(1ms);
      if (i == 50 && &t == p.t2.get()) t.offer_rdma(c);
      // Halfway through, each side waits for its own switch, so the second
      // half surely goes over RDMA however slow the machine is (the first
      // half crosses the switch at whatever point it happens).
      if (i == n / 2) {
        auto& r = &t == p.t2.get() ? p.r2 : p.r1;
        CHECK(r.wait_for([&] { return rdma_pair::rdma_up(r); }, 10s));
      }
      if (i % 20 == 0) std::this_thread::sleep_for(1ms);
    }
  };
  std::thread from_dialer([&] { stream(*p.t2, p.c21); });
  std::thread from_listener([&] { stream(*p.t1, p.c12); });
  from_dialer.join();
  from_listener.join();
  REQUIRE(p.r1.wait_messages(n + 1, 20s));
  REQUIRE(p.r2.wait_messages(n, 20s));
  CHECK(p.r1.wait_for([&] { return rdma_pair::rdma_up(p.r1); }));
  CHECK(p.r2.wait_for([&] { return rdma_pair::rdma_up(p.r2); }));
  {
    std::lock_guard<std::mutex> lock(p.r1.mu);
    for (int i = 1; i <= n; ++i) {
      const message& m = p.r1.messages[static_cast<std::size_t>(i)].msg;
      REQUIRE(m.correlation_id == static_cast<std::uint64_t>(i));
      REQUIRE(same_bytes(m.tensors.at(0), pattern(i % 40 == 0 ? (1 << 19) : 256, static_cast<float>(i))));
    }
  }
  {
    std::lock_guard<std::mutex> lock(p.r2.mu);
    for (int i = 1; i <= n; ++i) REQUIRE(p.r2.messages[static_cast<std::size_t>(i - 1)].msg.correlation_id == static_cast<std::uint64_t>(i));
  }
  // At least the second half went over the queue pairs, and nothing was refused.
  CHECK(p.t2->stats().rdma_messages_sent >= n / 2);
  CHECK(p.t1->stats().rdma_messages_received >= n / 2);
  CHECK(p.t1->stats().rdma_messages_sent >= n / 2);
  CHECK(p.fabric->stats().reads > 0);
  CHECK(p.t1->stats().bad_messages == 0);
  CHECK(p.t2->rdma_device().rfind("fake", 0) == 0);
}

TEST_CASE("transport: behind a stalled RDMA path, messages past its backlog wait in the transport and all arrive in order") {
  rdma_pair p;
  p.t2->offer_rdma(p.c21);
  REQUIRE(p.r2.wait_for([&] { return rdma_pair::rdma_up(p.r2); }, 10s));
  REQUIRE(p.r1.wait_for([&] { return rdma_pair::rdma_up(p.r1); }, 10s));
  std::size_t received_before = 0;
  {
    std::lock_guard<std::mutex> lock(p.r1.mu);
    received_before = p.r1.messages.size();
  }
  const std::uint64_t sent_before = p.t2->stats().messages_sent;
  p.fabric->stall(true);
  // More than the path's backlog (1024 messages beyond the 64 credits) and
  // the transport's queue alone: the rest must wait in the transport.
  constexpr int n = 1500;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  for (int i = 1; i <= n; ++i)
    while (!p.t2->send(p.c21, make_message(message_kind::oneway, static_cast<std::uint64_t>(1000 + i)))) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(1ms);
    }
  // The transport's thread hands messages to the path until its backlog is
  // full: wait until the count stops growing (however slowly that thread
  // runs on a busy machine), at most 20 s.
  std::uint64_t handed = 0;
  {
    const auto until = std::chrono::steady_clock::now() + 20s;
    int unchanged = 0;
    while (unchanged < 20 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(25ms);
      const std::uint64_t now_handed = p.t2->stats().messages_sent - sent_before;
      unchanged = now_handed == handed && handed >= 1024 ? unchanged + 1 : 0;
      handed = now_handed;
    }
  }
  MESSAGE("handed to the stalled path: " << handed << " of " << n);
  CHECK(handed < static_cast<std::uint64_t>(n));  // the backlog bound held the rest back
  CHECK(handed >= 1024);
  {
    std::lock_guard<std::mutex> lock(p.r1.mu);
    CHECK(p.r1.messages.size() == received_before);  // nothing crossed the stalled fabric
  }
  p.fabric->stall(false);
  REQUIRE(p.r1.wait_messages(received_before + n, 20s));
  {
    std::lock_guard<std::mutex> lock(p.r1.mu);
    for (int i = 1; i <= n; ++i)
      REQUIRE(p.r1.messages[received_before + static_cast<std::size_t>(i) - 1].msg.correlation_id ==
              static_cast<std::uint64_t>(1000 + i));
  }
  CHECK(p.t2->stats().messages_sent - sent_before == static_cast<std::uint64_t>(n));
  CHECK(p.t1->stats().bad_messages == 0);
}

TEST_CASE("transport: a peer without an RDMA device refuses the offer and the connection stays on TCP") {
  rdma_pair p(false);
  p.t2->offer_rdma(p.c21);
  REQUIRE(p.r2.wait_for([&] { return !p.r2.rdma_events.empty(); }));
  {
    std::lock_guard<std::mutex> lock(p.r2.mu);
    CHECK_FALSE(p.r2.rdma_events[0].up);
    CHECK(p.r2.rdma_events[0].reason.find("the peer has no RDMA device") != std::string::npos);
  }
  REQUIRE(p.t2->send(p.c21, make_message(message_kind::oneway, 9, {pattern(1000, 1)})));
  REQUIRE(p.r1.wait_messages(2));
  CHECK(p.t2->stats().rdma_messages_sent == 0);
}

TEST_CASE("transport: a failed RDMA path goes back to TCP, reports the connection down and up, and is not offered again") {
  rdma_pair p;
  p.t2->offer_rdma(p.c21);
  REQUIRE(p.r2.wait_for([&] { return rdma_pair::rdma_up(p.r2); }));
  REQUIRE(p.r1.wait_for([&] { return rdma_pair::rdma_up(p.r1); }));
  REQUIRE(p.t2->send(p.c21, make_message(message_kind::oneway, 1)));
  REQUIRE(p.r1.wait_messages(2));
  CHECK(p.t2->stats().rdma_messages_sent == 1);

  p.fabric->fail_all("transport retry counter exceeded");
  REQUIRE(p.t2->send(p.c21, make_message(message_kind::oneway, 2)));  // lost with the path
  REQUIRE(p.r2.wait_for([&] {
    for (const auto& e : p.r2.rdma_events)
      if (!e.up && e.reason.find("transport retry counter exceeded") != std::string::npos) return true;
    return false;
  }));
  CHECK(p.r2.wait_for([&] { return !p.r2.disconnects.empty() && !p.r2.connects.empty(); }));
  p.fabric->fail_all("");
  REQUIRE(p.t2->send(p.c21, make_message(message_kind::oneway, 3)));  // over TCP now
  REQUIRE(p.r1.wait_for([&] {
    for (const auto& m : p.r1.messages)
      if (m.msg.correlation_id == 3) return true;
    return false;
  }));
  p.t2->offer_rdma(p.c21);
  REQUIRE(p.r2.wait_for([&] {
    for (const auto& e : p.r2.rdma_events)
      if (!e.up && e.reason.find("failed earlier") != std::string::npos) return true;
    return false;
  }));
  // The listener heard of it (rdma.down) and fell back as well.
  REQUIRE(p.r1.wait_for([&] {
    for (const auto& e : p.r1.rdma_events)
      if (!e.up && (e.reason.find("the peer's RDMA path failed") != std::string::npos ||
                    e.reason.find("transport retry counter exceeded") != std::string::npos))
        return true;
    return false;
  }));
}

TEST_CASE("transport: an RDMA offer before any message from the peer is refused (queue pairs pin memory)") {
  auto fabric = rdma::fake_fabric::create();
  transport_recorder r1, r2;
  auto o1 = loopback_options("listener");
  o1.rdma_device = fabric->open_device();
  auto t1 = start_transport(o1, r1);
  auto o2 = loopback_options("dialer");
  o2.listen = "";
  o2.rdma_device = fabric->open_device();
  auto t2 = start_transport(o2, r2);
  const connection_id c = t2->connect(t1->endpoint());
  t2->offer_rdma(c);  // the offer is the first thing the listener hears
  REQUIRE(r2.wait_for([&] { return !r2.rdma_events.empty(); }));
  {
    std::lock_guard<std::mutex> lock(r2.mu);
    CHECK_FALSE(r2.rdma_events[0].up);
    CHECK(r2.rdma_events[0].reason.find("offer before the hello") != std::string::npos);
  }
  REQUIRE(t2->send(c, make_message(message_kind::oneway, 1)));
  REQUIRE(r1.wait_messages(1));
  CHECK(t2->stats().rdma_messages_sent == 0);
}
