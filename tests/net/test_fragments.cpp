// tests/net/test_fragments.cpp — the outbox's lanes, barriers and fragments,
// the reassembler (also against hostile fragments), and a transport pair
// whose small messages pass a large one on a shaped link.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include <doctest/doctest.h>
#include <zmq.hpp>

#include "net/codec.hpp"
#include "net/fragment.hpp"
#include "net/outbox.hpp"
#include "net/zmq_transport.hpp"
#include "transport_recorder.hpp"

using namespace corolla;
using namespace corolla::net;
using namespace corolla::net::testing;

namespace {

/// An out_message of `bytes` bytes in one frame, labelled by its first byte.
out_message unit(std::uint64_t lane, std::size_t bytes, unsigned char label, bool barrier = false) {
  auto data = std::make_shared<std::vector<unsigned char>>(bytes, label);
  out_message m;
  m.frames.push_back(out_frame{data->data(), data->size(), data});
  m.bytes = bytes;
  m.lane = lane;
  m.barrier = barrier;
  return m;
}

/// Label of a whole unit, or 'f' for a fragment.
char label_of(const out_message& m) {
  if (m.fragment) return 'f';
  return static_cast<char>(*static_cast<const unsigned char*>(m.frames[0].data));
}

/// Labels of everything next(bulk) hands out until it has nothing more.
std::string drain(outbox& box, bool bulk = true) {
  std::string order;
  while (auto m = box.next(bulk)) order += label_of(*m);
  return order;
}

/// The frames of a fragment as a receiver gets them.
std::vector<in_frame> received(const out_message& m) {
  std::vector<in_frame> v;
  for (const auto& f : m.frames) v.push_back(in_frame{f.data, f.size, f.owner});
  return v;
}

message tensor_message(std::uint64_t correlation, std::int64_t floats, float seed) {
  message m;
  m.kind = message_kind::request;
  m.sender_node = "node-a";
  m.sender_actor = "sender";
  m.target_actor = "target";
  m.correlation_id = correlation;
  m.type = "blob";
  std::vector<float> v(static_cast<std::size_t>(floats));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = seed + static_cast<float>(i % 9973) * 0.25f;
  m.tensors.push_back(Tensor::from_f32(v, {floats}));
  const std::vector<float> one{seed};
  m.tensors.push_back(Tensor::from_f32(one, {1}));
  return m;
}

out_message encoded(const message& m) {
  out_message o;
  o.frames = encode(m);
  for (const auto& f : o.frames) o.bytes += f.size;
  o.lane = lane_of(m);
  o.barrier = is_barrier(m);
  return o;
}

double ms(shaping_clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

/// Two transports on loopback; a's connection to b has carried one message
/// (received as rb.messages[0]) and is then shaped with `profile`.
struct shaped_pair {
  transport_recorder ra, rb;
  std::unique_ptr<zmq_transport> a, b;
  connection_id to_b = 0;
  explicit shaped_pair(const std::string& profile) {
    a = start_transport(loopback_options("pair-a"), ra);
    b = start_transport(loopback_options("pair-b"), rb);
    to_b = a->connect(b->endpoint());
    REQUIRE(a->send(to_b, make_message(message_kind::oneway, 1)));
    REQUIRE_MESSAGE(rb.wait_messages(1), "the first message did not arrive");
    a->set_profile(to_b, parse_link_profile(profile));
  }
};

}  // namespace

TEST_CASE("lanes: two named actors keep their order, anonymous requests and answers each have their own") {
  message a = make_message(message_kind::request, 1);
  a.sender_actor = std::string("stage");
  a.target_actor = std::string("dp");
  message b = a;
  b.correlation_id = 2;
  b.kind = message_kind::oneway;
  CHECK(lane_of(a) == lane_of(b));  // CAF's order between two actors
  message c = a;
  c.target_actor = "other";
  CHECK(lane_of(c) != lane_of(a));

  message anon = a;
  anon.sender_actor.clear();
  message anon2 = anon;
  anon2.correlation_id = 2;
  CHECK(lane_of(anon) != lane_of(anon2));
  message answer = make_message(message_kind::response, 1);
  message answer2 = answer;
  answer2.correlation_id = 2;
  answer2.kind = message_kind::error;
  CHECK(lane_of(answer) != lane_of(answer2));

  for (auto k : {message_kind::hello, message_kind::hello_ack, message_kind::heartbeat, message_kind::heartbeat_ack,
                 message_kind::goodbye}) {
    message m;
    m.kind = k;
    CHECK(lane_of(m) == 0);
  }
  for (const message* m : {&a, &b, &c, &anon, &anon2, &answer, &answer2}) CHECK(lane_of(*m) != 0);
  message bye;
  bye.kind = message_kind::goodbye;
  CHECK(is_barrier(bye));
  CHECK_FALSE(is_barrier(a));
}

TEST_CASE("outbox: small messages of other lanes pass a large one, a lane keeps its order") {
  outbox box(4096);
  box.push(unit(1, 5 * 4096, 'L'));  // large: 5 fragments
  box.push(unit(1, 100, 'a'));       // same lane: must wait for L
  box.push(unit(2, 100, 'b'));       // other lane: passes
  box.push(unit(0, 40, 'h'));        // heartbeat lane: passes
  CHECK(box.size() == 4);
  // Small ones first, then L's fragments, then what waited behind L.
  CHECK(drain(box) == "bhfffffa");
  CHECK(box.empty());
  CHECK(box.fragments_sent() == 5);
  CHECK(box.fragmented_messages() == 1);

  SUBCASE("a small message sent between two fragments goes next") {
    box.push(unit(1, 3 * 4096, 'L'));
    auto f1 = box.next(true);
    REQUIRE(f1);
    CHECK(f1->fragment);
    CHECK_FALSE(f1->last);
    box.push(unit(7, 10, 's'));
    CHECK(box.small_ready());
    auto s = box.next(true);
    REQUIRE(s);
    CHECK(label_of(*s) == 's');
    CHECK(drain(box) == "ff");
  }
  SUBCASE("with bulk held back only small messages leave") {
    box.push(unit(1, 3 * 4096, 'L'));
    box.push(unit(2, 10, 's'));
    CHECK(drain(box, false) == "s");
    CHECK(box.size() == 1);
    CHECK_FALSE(box.small_ready());
    CHECK(drain(box, true) == "fff");
  }
}

TEST_CASE("outbox: large messages of two lanes take turns, and a message just over the size stays whole") {
  outbox box(4096);
  box.push(unit(1, 3 * 4096, 'A'));
  box.push(unit(2, 2 * 4096, 'B'));
  std::vector<std::uint64_t> lanes;
  while (auto m = box.next(true)) {
    CHECK(m->fragment);
    lanes.push_back(m->lane);
  }
  CHECK(lanes == std::vector<std::uint64_t>{1, 2, 1, 2, 1});
  box.push(unit(3, 4096 + 256, 'w'));  // within 1/16 over: whole
  CHECK(drain(box) == "w");
}

TEST_CASE("outbox: a barrier leaves after everything before it, and nothing after it overtakes it") {
  outbox box(4096);
  box.push(unit(1, 3 * 4096, 'L'));
  box.push(unit(0, 20, 'G', true));  // goodbye
  box.push(unit(2, 20, 'x'));
  CHECK(drain(box) == "fffGx");

  SUBCASE("the last fragment counts as the message, the others do not") {
    box.push(unit(1, 2 * 4096, 'L'));
    auto f1 = box.next(true);
    auto f2 = box.next(true);
    REQUIRE(f1);
    REQUIRE(f2);
    CHECK_FALSE(f1->last);
    CHECK(f2->last);
    CHECK(f1->tcp_only);
  }
}

TEST_CASE("outbox: without fragments, or for the RDMA path, a large message leaves whole and in order") {
  outbox never(0);
  never.push(unit(1, 10 * 4096, 'L'));
  never.push(unit(2, 10, 's'));
  CHECK(drain(never) == "Ls");  // FIFO as before fragments existed

  outbox box(4096);
  box.push(unit(1, 10 * 4096, 'L'));
  auto whole = box.next(true, false);
  REQUIRE(whole);
  CHECK(label_of(*whole) == 'L');
  CHECK(whole->bytes == 10 * 4096);

  box.push(unit(1, 10 * 4096, 'M'));
  CHECK(box.next(true)->fragment);  // started in fragments: stays in fragments
  CHECK(box.next(true, false)->fragment);
  CHECK(box.drop_started() == 1);
  CHECK(box.empty());
}

TEST_CASE("fragments of interleaved messages reassemble bit-exact into aligned frames") {
  outbox box(64 * 1024);
  const message big1 = tensor_message(1, 300000, 1.0f);  // 1.2 MB: 19 fragments
  message big2 = tensor_message(2, 200000, -3.0f);
  big2.sender_actor = "another";  // another lane: the two interleave
  box.push(encoded(big1));
  box.push(encoded(big2));
  reassembler in;
  std::vector<message> done;
  int fragments = 0;
  while (auto f = box.next(true)) {
    ++fragments;
    auto frames = received(*f);
    REQUIRE(is_fragment_header(frames[0].data, frames[0].size));
    auto r = in.add(frames);
    REQUIRE_MESSAGE(r, error_text(r));
    if (!*r) continue;
    for (const auto& fr : **r) CHECK(reinterpret_cast<std::uintptr_t>(fr.data) % 64 == 0);
    auto m = decode(**r);
    REQUIRE_MESSAGE(m, error_text(m));
    done.push_back(std::move(*m));
  }
  CHECK(fragments > 30);
  REQUIRE(done.size() == 2);
  CHECK(in.partial_messages() == 0);
  CHECK(in.reserved_bytes() == 0);
  // The smaller message finishes first: they took turns.
  CHECK(done[0].correlation_id == 2);
  CHECK(done[1].correlation_id == 1);
  CHECK(done[1].tensors[0].to_vector() == big1.tensors[0].to_vector());
  CHECK(done[1].tensors[1].to_vector() == big1.tensors[1].to_vector());
  CHECK(done[0].tensors[0].to_vector() == big2.tensors[0].to_vector());
  CHECK(done[0].sender_actor == "another");
}

TEST_CASE("the reassembler refuses hostile fragments and holds nothing for them") {
  decode_limits limits;
  limits.max_tensor_bytes = 1 << 20;
  limits.max_tensors = 4;
  limits.max_partial_messages = 2;
  limits.max_reassembly_bytes = 3 << 20;
  reassembler in(limits);
  std::vector<unsigned char> payload(1000, 7);

  auto fragment = [&](std::uint64_t id, std::uint64_t position, std::vector<std::uint64_t> sizes,
                      std::size_t bytes) -> caf::expected<std::optional<std::vector<in_frame>>> {
    fragment_header h;
    h.message_id = id;
    h.position = position;
    h.frame_sizes = std::move(sizes);
    const out_frame head = encode_fragment_header(h);
    std::vector<in_frame> parts{in_frame{head.data, head.size, head.owner}};
    if (bytes > 0) parts.push_back(in_frame{payload.data(), bytes, nullptr});
    return in.add(parts);
  };
  auto refused = [&](caf::expected<std::optional<std::vector<in_frame>>> r, const std::string& words) {
    REQUIRE_FALSE(r);
    const std::string text = error_text(r.error());
    INFO(text);
    CHECK(text.find(words) != std::string::npos);
  };

  refused(fragment(1, 0, {}, 10), "lists no frame sizes");
  refused(fragment(1, 0, {0, 10}, 10), "envelope of 0 bytes");
  refused(fragment(1, 0, {(2 << 20), 10}, 10), "envelope of");
  refused(fragment(1, 0, {64, 1, 1, 1, 1, 1}, 10), "5 tensor frames exceed the limit of 4");
  refused(fragment(1, 0, {64, (1 << 20) + 1}, 10), "exceeds the limit of 1048576");
  refused(fragment(9, 500, {}, 10), "never started");
  CHECK(in.partial_messages() == 0);

  // Two messages in progress are the limit; their bytes count against the reserve.
  REQUIRE(fragment(1, 0, {64, 1 << 20}, 100));
  REQUIRE(fragment(2, 0, {64, 1 << 20}, 100));
  CHECK(in.partial_messages() == 2);
  refused(fragment(3, 0, {64, 100}, 10), "incomplete messages on this connection");
  refused(fragment(1, 50, {}, 10), "expected byte 100");  // out of order: message 1 dropped
  CHECK(in.partial_messages() == 1);
  refused(fragment(1, 100, {}, 10), "never started");
  refused(fragment(2, 100, {64, 10}, 10), "not the first");
  CHECK(in.partial_messages() == 0);
  CHECK(in.reserved_bytes() == 0);
  REQUIRE(fragment(4, 0, {64, 1 << 20}, 100));
  REQUIRE(fragment(5, 0, {64, 1 << 20}, 100));
  in.clear();
  refused(fragment(6, 0, {1024, 1 << 20, 1 << 20, 1 << 20}, 10), "would exceed the 3145728 bytes");
  refused(fragment(7, 0, {64, 100}, 1000), "runs past the message's end");
  refused(fragment(8, 0, {64, 100}, 0), "without payload");
  CHECK(in.reserved_bytes() == 0);

  // Garbage where a header belongs.
  const unsigned char junk[16] = {0xff, 0xff, 0xff, 0xff, 'f', 'r', 'a', 'g', 1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<in_frame> parts{in_frame{junk, sizeof junk, nullptr}};
  refused(in.add(parts), "fragment:");
  const unsigned char short_marker[8] = {0xff, 0xff, 0xff, 0xff, 'f', 'r', 'a', 'g'};
  parts = {in_frame{short_marker, sizeof short_marker, nullptr}};
  refused(in.add(parts), "after the marker");
  CHECK_FALSE(is_fragment_header(junk, 7));
}

TEST_CASE("over a shaped 1 Gbit/s link small messages pass a 64 MiB one, which arrives bit-exact") {
  shaped_pair pair("bw=1Gbit,lat=1ms");
  auto& [ra, rb, a, b, to_b] = pair;

  message big = tensor_message(100, std::int64_t{16} << 20, 2.0f);  // 64 MiB: about 540 ms at 1 Gbit/s
  big.kind = message_kind::oneway;
  const auto expected = big.tensors[0].to_vector();
  const auto t0 = shaping_clock::now();
  REQUIRE(a->send(to_b, big));
  big = message();
  // Small requests from an anonymous requester while the big one travels.
  std::vector<shaping_clock::time_point> sent;
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    message small = make_message(message_kind::request, 1000 + i);
    small.sender_actor.clear();
    sent.push_back(shaping_clock::now());
    REQUIRE(a->send(to_b, small));
  }
  REQUIRE_MESSAGE(rb.wait_messages(7, 20s), "not every message arrived");
  std::lock_guard<std::mutex> lock(rb.mu);
  const transport_recorder::received* got_big = nullptr;
  std::vector<double> small_ms(5, -1);
  std::vector<shaping_clock::time_point> small_at(5);
  for (const auto& r : rb.messages) {
    if (r.msg.correlation_id == 100) got_big = &r;
    if (r.msg.correlation_id >= 1000) {
      small_at[r.msg.correlation_id - 1000] = r.at;
      small_ms[r.msg.correlation_id - 1000] = ms(r.at - sent[r.msg.correlation_id - 1000]);
    }
  }
  REQUIRE(got_big);
  const double big_ms = ms(got_big->at - t0);
  const double tx_ms = (64.0 * (1 << 20)) * 8 / 1e9 * 1e3;
  MESSAGE("64 MiB at 1 Gbit/s: " << big_ms << " ms (link: " << tx_ms << " ms); small messages meanwhile took "
                                 << small_ms[0] << ", " << small_ms[1] << ", " << small_ms[2] << ", " << small_ms[3]
                                 << ", " << small_ms[4] << " ms");
  // Every small message sent well before the big one arrived (all of them,
  // unless the machine stalled the sending thread for a long time)
  // overtook it, after about one 1 MiB fragment (8.4 ms) plus the latency.
  int passed = 0;
  for (std::size_t i = 0; i < small_ms.size(); ++i) {
    REQUIRE(small_ms[i] >= 0);
    if (sent[i] + std::chrono::milliseconds(100) > got_big->at) continue;
    ++passed;
    CHECK(small_at[i] < got_big->at);
    CHECK(small_ms[i] < 0.5 * tx_ms);  // room for a busy machine; one FIFO would take up to tx_ms
  }
  CHECK(passed >= 3);
  CHECK(big_ms > 0.9 * tx_ms);
  CHECK(got_big->msg.tensors[0].to_vector() == expected);
  CHECK(rb.bad.empty());
  CHECK(a->stats().fragments_sent >= 64);
  CHECK(b->stats().fragments_received == a->stats().fragments_sent);
  CHECK(a->stats().messages_sent == 7);
  CHECK(b->stats().messages_received == 7);
}

TEST_CASE("a raw peer's bad fragments are dropped with a reason and the connection keeps working") {
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("rawfrag-a"), ra);
  auto b = start_transport(loopback_options("rawfrag-b"), rb);
  const connection_id to_b = a->connect(b->endpoint());
  // A fragment of a message that was never started.
  fragment_header h;
  h.message_id = 77;
  h.position = 4096;
  const out_frame head = encode_fragment_header(h);
  message carrier = make_message(message_kind::oneway, 5);
  REQUIRE(a->send(to_b, carrier));
  REQUIRE_MESSAGE(rb.wait_messages(1), "the carrier did not arrive");
  // Hand-made frames go through a raw DEALER to b's ROUTER.
  zmq::context_t ctx;
  zmq::socket_t raw{ctx, zmq::socket_type::dealer};
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::routing_id, "rawfrag-vandal");
  raw.connect(b->endpoint());
  raw.send(zmq::buffer(head.data, head.size), zmq::send_flags::sndmore);
  raw.send(zmq::str_buffer("payload"), zmq::send_flags::none);
  REQUIRE_MESSAGE(rb.wait_for([&] { return !rb.bad.empty(); }), "the bad fragment was not reported");
  {
    std::lock_guard<std::mutex> lock(rb.mu);
    CHECK(rb.bad[0].second.find("never started") != std::string::npos);
  }
  REQUIRE(a->send(to_b, make_message(message_kind::oneway, 6)));
  CHECK(rb.wait_messages(2));
}

TEST_CASE("on a slow shaped link fragments shrink to about 8.5 ms of transmission each") {
  shaped_pair pair("bw=100Mbit");
  auto& [ra, rb, a, b, to_b] = pair;

  message big = tensor_message(100, 1 << 20, 1.0f);  // 4 MiB: about 335 ms at 100 Mbit/s
  big.kind = message_kind::oneway;
  const auto t0 = shaping_clock::now();
  REQUIRE(a->send(to_b, big));
  message small = make_message(message_kind::request, 200);
  small.sender_actor.clear();
  REQUIRE(a->send(to_b, small));
  const auto sent_small = shaping_clock::now();
  REQUIRE_MESSAGE(rb.wait_messages(3, 10s), "not every message arrived");
  std::lock_guard<std::mutex> lock(rb.mu);
  const auto& small_got = rb.messages[1].msg.correlation_id == 200 ? rb.messages[1] : rb.messages[2];
  const auto& big_got = rb.messages[1].msg.correlation_id == 200 ? rb.messages[2] : rb.messages[1];
  REQUIRE(small_got.msg.correlation_id == 200);
  REQUIRE(big_got.msg.correlation_id == 100);
  // The small one overtook the big one (unless this thread stalled for
  // most of the big one's 335 ms before sending it).
  if (sent_small + std::chrono::milliseconds(100) < big_got.at) CHECK(small_got.at < big_got.at);
  const double small_ms = ms(small_got.at - sent_small), big_ms = ms(big_got.at - t0);
  MESSAGE("4 MiB at 100 Mbit/s: " << big_ms << " ms in " << a->stats().fragments_sent
                                  << " fragments; a small message sent after it arrived in " << small_ms << " ms");
  // 104 KiB pieces: about 40 of them (1 MiB pieces would be 4, at 84 ms each).
  CHECK(a->stats().fragments_sent >= 30);
  CHECK(big_ms > 300);
}

TEST_CASE("a receiver that stops taking fragments in stops the sender after its credit window") {
  // Message 99 holds b's I/O thread, as a receiver too busy to read would
  // be (ZeroMQ itself goes on reading from TCP meanwhile), until the test
  // lets it go: not for a fixed time, which a loaded machine could use up
  // before the count below is read (the sender then goes on, credited).
  std::atomic<bool> stalled{false}, release{false};
  transport_recorder ra, rb;
  auto a = start_transport(loopback_options("credit-a"), ra);
  auto b = start_transport(loopback_options("credit-b"), rb);
  struct let_go {  // on every exit, before the transports stop
    std::atomic<bool>& release;
    ~let_go() { release = true; }
  } guard{release};
  const connection_id to_b = a->connect(b->endpoint());
  rb.on_message_hook = [&](connection_id, const message& m) {
    if (m.correlation_id != 99) return;
    stalled = true;
    for (const auto until = std::chrono::steady_clock::now() + 60s;
         !release && std::chrono::steady_clock::now() < until;)
      std::this_thread::sleep_for(5ms);
  };
  const auto wait_until = [](const std::function<bool()>& done, std::chrono::milliseconds timeout) {
    for (const auto until = std::chrono::steady_clock::now() + timeout; !done();) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(10ms);
    }
    return true;
  };
  REQUIRE(a->send(to_b, make_message(message_kind::oneway, 99)));
  REQUIRE_MESSAGE(wait_until([&] { return stalled.load(); }, 20s), "message 99 did not reach b's handler");
  message big = tensor_message(100, std::int64_t{16} << 20, 3.0f);  // 64 MiB and its envelope: 65 fragments
  big.kind = message_kind::oneway;
  const auto expected = big.tensors[0].to_vector();
  REQUIRE(a->send(to_b, big));
  big = message();
  // The sender goes on until its credit is spent, then stops: at least a
  // few fragments, then no new one for half a second.
  REQUIRE_MESSAGE(wait_until([&] { return a->stats().fragments_sent >= 4; }, 20s), "the sender sent nothing");
  auto held = a->stats().fragments_sent;
  auto since = std::chrono::steady_clock::now();
  REQUIRE(wait_until(
      [&] {
        const auto now_sent = a->stats().fragments_sent;
        if (now_sent != held) held = now_sent, since = std::chrono::steady_clock::now();
        return std::chrono::steady_clock::now() - since > 500ms;
      },
      30s));
  MESSAGE("fragments sent while the receiver was stalled: " << held << " of 65");
  CHECK(held <= 17);  // 16 MiB of credit, and the one that filled it
  release = true;
  REQUIRE_MESSAGE(rb.wait_messages(2, 20s), "the large message did not arrive");
  std::lock_guard<std::mutex> lock(rb.mu);
  CHECK(rb.messages[1].msg.tensors.at(0).to_vector() == expected);
  CHECK(a->stats().fragments_sent == 65);  // 64 MiB and the envelope
  CHECK(rb.bad.empty());
}
