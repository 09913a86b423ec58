// The link gate (actors/link_gate.hpp): one-way messages that skip the
// link actors while a link is up still arrive in the order they were sent,
// are counted in the link's statistics, and node::post refuses at once what
// the peer does not take. Two nodes in one process over real ZeroMQ on
// 127.0.0.1.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "actors/corolla.hpp"
#include "tests/actors/node_test_util.hpp"

using namespace std::chrono_literals;

namespace corolla {
using namespace node_test;

namespace {

std::vector<std::uint8_t> encode_index(std::uint32_t i) {
  std::vector<std::uint8_t> b(4);
  std::memcpy(b.data(), &i, 4);
  return b;
}

/// Records the index in every message's body, with who sent it; answers
/// requests with "ok", and a "report" request with every index recorded so
/// far (4 bytes each) and the senders it saw, joined by '\n', as its type.
struct recorder_state {
  std::vector<std::uint8_t> seen;
  std::string senders;
  static inline const char* name = "corolla.test.recorder";
};

caf::behavior recorder(caf::stateful_actor<recorder_state>* self) {
  return {
      [self](remote_message& m) -> caf::result<remote_message> {
        auto& st = self->state;
        if (m.type == "report") {
          remote_message r;
          r.type = st.senders;
          r.body = st.seen;
          return r;
        }
        st.seen.insert(st.seen.end(), m.body.begin(), m.body.end());
        const std::string who = m.from_node + "/" + m.from_actor;
        if (st.senders.find(who) == std::string::npos) st.senders += who + "\n";
        remote_message ok;
        ok.type = "ok";
        return ok;
      },
  };
}

/// The indices a recorder saw, in order, and the senders it named.
std::pair<std::vector<std::uint32_t>, std::string> report(node& from, const std::string& peer) {
  remote_message ask;
  ask.type = "report";
  auto r = from.request(peer, "recorder", ask, 10s);
  if (!r) return {};  // the caller's count says what is missing
  std::vector<std::uint32_t> order(r->body.size() / 4);
  std::memcpy(order.data(), r->body.data(), order.size() * 4);
  return {order, r->type};
}

/// Waits until the recorder on `peer` saw `n` indices (or 20 s passed).
std::vector<std::uint32_t> await_indices(node& from, const std::string& peer, std::size_t n, std::string* senders = nullptr) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    auto [order, who] = report(from, peer);
    if (order.size() >= n || std::chrono::steady_clock::now() > until) {
      if (senders) *senders = who;
      return order;
    }
    std::this_thread::sleep_for(20ms);
  }
}

bool in_order(const std::vector<std::uint32_t>& order, std::size_t n) {
  if (order.size() != n) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (order[i] != i) return false;
  return true;
}

}  // namespace

TEST_CASE("one-way messages and requests from one peer reach their actor in the order sent") {
  // Requests go through the receiving node's link actor; one-way messages
  // skip it while the link is up, unless something sent before them is
  // still with the actor. A one-way message right behind a request must not
  // overtake it.
  auto a = start_node();
  auto b = start_node();
  REQUIRE_FALSE(b->publish("recorder", b->system().spawn(recorder)));
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);
  auto target = a->remote_actor(*peer, "recorder");
  REQUIRE(target);
  caf::scoped_actor self{a->system()};
  using handle = decltype(self->request(caf::actor{}, 20s, remote_message{}));
  std::vector<handle> answers;
  // In rounds of 300, within the transport's queue (send_hwm).
  constexpr std::uint32_t n = 3000, round = 300;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (i > 0 && i % round == 0) REQUIRE(await_indices(*a, *peer, i).size() == i);
    remote_message m;
    m.type = "index";
    m.body = encode_index(i);
    if (i % 5 == 0 || i % 7 == 0)
      answers.push_back(self->request(*target, 20s, std::move(m)));
    else
      self->send(*target, std::move(m));
  }
  int answered = 0;
  for (auto& h : answers) h.receive([&](remote_message& r) { answered += r.type == "ok"; }, [](caf::error&) {});
  CHECK(answered == static_cast<int>(answers.size()));
  const auto order = await_indices(*a, *peer, n);
  if (order.size() != n) {
    std::vector<bool> got(n);
    for (auto i : order) if (i < n) got[i] = true;
    for (std::uint32_t i = 0; i < n; ++i) if (!got[i]) MESSAGE("missing " << i);
  }
  REQUIRE(order.size() == n);
  std::size_t first_wrong = n;
  for (std::size_t i = 0; i < n && first_wrong == n; ++i)
    if (order[i] != i) first_wrong = i;
  // (The message is built under -s too: no order[n].)
  CHECK_MESSAGE(first_wrong == n, "index " << first_wrong << " arrived as "
                                           << (first_wrong < n ? std::to_string(order[first_wrong]) : "-"));
  // The link's counters include what skipped its actor.
  auto stats = b->stats(a->id());
  REQUIRE(stats);
  CHECK(stats->messages_received >= n);
  CHECK(b->traffic().messages_received >= n);
  MESSAGE(n << " messages, " << answers.size() << " of them requests");
}

TEST_CASE("node::post delivers in order from any thread, names its sender, and refuses at once what the peer does not take") {
  auto a = start_node();
  node_options small;
  small.max_message_bytes = 1 << 16;  // announced in its hello
  auto b = start_node(small);
  REQUIRE_FALSE(b->publish("recorder", b->system().spawn(recorder)));
  // Before any link: not connected, at once.
  remote_message early;
  early.type = "index";
  auto refused = a->post(b->id(), "recorder", early);
  REQUIRE(refused);
  CHECK(error_code(refused) == "not_connected");
  auto peer = a->connect(b->endpoint());
  REQUIRE(peer);

  constexpr std::uint32_t n = 2000, round = 250;
  std::string post_error;
  std::thread poster([&] {
    for (std::uint32_t i = 0; i < n; ++i) {
      // In rounds, within the transport's queue (send_hwm).
      if (i > 0 && i % round == 0 && await_indices(*a, *peer, i).size() != i) {
        post_error = "the first " + std::to_string(i) + " posts did not arrive within 20 s";
        return;
      }
      remote_message m;
      m.type = "index";
      m.body = encode_index(i);
      if (i % 3 == 0) m.tensors.push_back(Tensor::zeros({64}));
      if (auto err = a->post(*peer, "recorder", std::move(m), "poster")) {
        post_error = "post " + std::to_string(i) + ": " + error_message(err);
        return;
      }
    }
  });
  poster.join();
  CHECK_MESSAGE(post_error.empty(), post_error);
  std::string senders;
  const auto order = await_indices(*a, *peer, n, &senders);
  CHECK(in_order(order, n));
  CHECK(senders == a->id() + "/poster\n");
  auto sent = a->stats(*peer);
  REQUIRE(sent);
  CHECK(sent->messages_sent >= n);
  CHECK(sent->bytes_sent >= std::uint64_t{n} * 4);

  // Larger than b takes: send_failed now, with the reason; the link stays up.
  remote_message big;
  big.type = "index";
  big.tensors.push_back(Tensor::zeros({(1 << 16) / 4 + 16}));
  auto too_big = a->post(*peer, "recorder", big);
  REQUIRE(too_big);
  CHECK(error_code(too_big) == "send_failed");
  CHECK(error_message(too_big).find("65536-byte messages peer") != std::string::npos);
  remote_message after;
  after.type = "index";
  after.body = encode_index(n);
  CHECK_FALSE(a->post(*peer, "recorder", after));
  CHECK(await_indices(*a, *peer, n + 1).size() == n + 1);
  CHECK(a->peer_is_up(*peer));
  // Posting to this node's own actor delivers locally.
  REQUIRE_FALSE(a->publish("local", a->system().spawn(recorder)));
  CHECK_FALSE(a->post(a->id(), "local", after, "poster"));
  CHECK(a->post(a->id(), "nobody", after));
}

}  // namespace corolla
