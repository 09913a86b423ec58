// apps/examples/embed_echo.cpp — a program embedding corolla's actor runtime
// (built as corolla-embed-example; walked through in docs/embedding.md).
//
//   corolla-embed-example                     two nodes in this process
//   corolla-embed-example tcp://127.0.0.1:P   one node, talking to a running `corolla node`
//
// It publishes its own actor, calls an actor on the other node like a local
// one, reads the link's statistics and waits for peer_down.
#include <cstdio>
#include <string>
#include <thread>

#include "actors/corolla.hpp"

using namespace std::chrono_literals;

/// A custom actor: multiplies the f32 tensor of a "scale" message by 3.
caf::behavior tripler(caf::event_based_actor*) {
  return {
      [](corolla::remote_message& m) -> caf::result<corolla::remote_message> {
        if (m.type != "scale" || m.tensors.size() != 1 || m.tensors[0].type() != corolla::dtype::f32)
          return corolla::make_error(corolla::errc::bad_message, "tripler wants one f32 tensor");
        corolla::Tensor out = m.tensors[0].clone();
        for (std::int64_t i = 0; i < out.numel(); ++i) out.data<float>()[i] *= 3;
        corolla::remote_message reply;
        reply.type = "scaled";
        reply.tensors = {out};
        return reply;
      },
  };
}

/// Prints whatever the runtime reports about peers.
caf::behavior peer_watcher(caf::event_based_actor*) {
  return {
      [](const corolla::peer_down& d) { std::printf("peer_down: %s (%s)\n", d.peer.c_str(), d.reason.c_str()); },
      [](const corolla::peer_up& u) { std::printf("peer_up: %s at %s\n", u.peer.c_str(), u.endpoint.c_str()); },
  };
}

/// Starts a node named `id` (listening on a free port) or exits with the reason.
std::unique_ptr<corolla::node> start_or_die(const std::string& id) {
  corolla::node_options o;
  o.node_id = id;
  auto n = corolla::node::start(o);
  if (!n) {
    std::fprintf(stderr, "cannot start a node: %s\n", corolla::error_message(n.error()).c_str());
    std::exit(1);
  }
  return std::move(*n);
}

int main(int argc, char** argv) {
  // The "server": our own node hosting the tripler, unless a peer is given.
  std::unique_ptr<corolla::node> server;
  std::string endpoint = argc > 1 ? argv[1] : "";
  std::string target = "echo";
  if (endpoint.empty()) {
    server = start_or_die("server");
    server->publish("tripler", server->system().spawn(tripler));
    endpoint = server->endpoint();
    target = "tripler";
  }

  auto client = start_or_die("client");
  auto watcher = client->system().spawn(peer_watcher);
  client->monitor_peer("", watcher);  // "" = every peer

  auto peer = client->connect(endpoint);
  if (!peer) {
    std::fprintf(stderr, "connect %s: %s\n", endpoint.c_str(), corolla::error_message(peer.error()).c_str());
    return 1;
  }
  std::printf("connected to node %s at %s\n", peer->c_str(), endpoint.c_str());

  // A remote actor is a caf::actor: request() it like a local one.
  auto remote = client->remote_actor(*peer, target);
  corolla::remote_message m;
  m.type = target == "echo" ? "echo" : "scale";
  m.tensors = {corolla::Tensor::from_f32(std::vector<float>{1, 2, 3, 4}, {2, 2})};
  {
    caf::scoped_actor self{client->system()};
    self->request(*remote, 5s, m).receive(
        [&](corolla::remote_message& r) {
          auto v = r.tensors.at(0).to_vector();
          std::printf("%s answered '%s': [%g, %g, %g, %g]\n", target.c_str(), r.type.c_str(), v[0], v[1], v[2], v[3]);
        },
        [&](caf::error& e) { std::printf("%s failed: %s\n", target.c_str(), corolla::error_message(e).c_str()); });

    // Asking for an actor the peer does not have is an error, not a crash.
    auto nobody = client->remote_actor(*peer, "nobody");
    self->request(*nobody, 5s, m).receive(
        [](corolla::remote_message&) {},
        [](caf::error& e) { std::printf("nobody: %s\n", corolla::error_code(e).c_str()); });
  }

  std::this_thread::sleep_for(500ms);  // a few heartbeats
  if (auto s = client->stats(*peer))
    std::printf("link: rtt %.0f us over %llu heartbeats, %s\n", s->rtt_us,
                static_cast<unsigned long long>(s->rtt_samples), s->profile.c_str());

  if (server) {
    server->stop();                     // the client's watcher prints peer_down
    std::this_thread::sleep_for(200ms);
  }
  caf::anon_send_exit(watcher, caf::exit_reason::user_shutdown);
  return 0;
}
