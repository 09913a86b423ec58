// A node's control actor (actors/node_control.hpp).
#include "actors/node_control.hpp"

#include <algorithm>
#include <optional>

#include <caf/event_based_actor.hpp>
#include <caf/result.hpp>
#include <spdlog/spdlog.h>

#include "actors/capnp_body.hpp"
#include "actors/errors.hpp"
#include "actors/link_actor.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "actors/node_context.hpp"
#include "net/shaping.hpp"
#include "net/wire.capnp.h"

namespace corolla {

namespace {

struct reshape_request {
  std::string token, profile;
};

std::vector<std::uint8_t> encode_reshape(const reshape_request& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::ControlReshape>();
  w.setToken(r.token);
  w.setProfile(r.profile);
  return capnp_body::flat(b);
}

caf::expected<reshape_request> decode_reshape(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::ControlReshape>(body, "ControlReshape", [](wire::ControlReshape::Reader r) {
    return reshape_request{capnp_body::text(r.getToken(), "token", 1024), capnp_body::text(r.getProfile(), "profile", 1024)};
  });
}

struct partition_request {
  std::string token;
  bool on = false;
};

std::vector<std::uint8_t> encode_partition(const partition_request& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::ControlPartition>();
  w.setToken(r.token);
  w.setOn(r.on);
  return capnp_body::flat(b);
}

caf::expected<partition_request> decode_partition(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::ControlPartition>(body, "ControlPartition", [](wire::ControlPartition::Reader r) {
    return partition_request{capnp_body::text(r.getToken(), "token", 1024), r.getOn()};
  });
}

struct corrupt_request {
  std::string token, actor;
  bool on = false;
};

std::vector<std::uint8_t> encode_corrupt(const corrupt_request& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::ControlCorrupt>();
  w.setToken(r.token);
  w.setActor(r.actor);
  w.setOn(r.on);
  return capnp_body::flat(b);
}

caf::expected<corrupt_request> decode_corrupt(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::ControlCorrupt>(body, "ControlCorrupt", [](wire::ControlCorrupt::Reader r) {
    return corrupt_request{capnp_body::text(r.getToken(), "token", 1024), capnp_body::text(r.getActor(), "actor", 256),
                           r.getOn()};
  });
}

std::vector<std::uint8_t> encode_stall(const corrupt_request& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::ControlStall>();
  w.setToken(r.token);
  w.setActor(r.actor);
  w.setOn(r.on);
  return capnp_body::flat(b);
}

caf::expected<corrupt_request> decode_stall(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::ControlStall>(body, "ControlStall", [](wire::ControlStall::Reader r) {
    return corrupt_request{capnp_body::text(r.getToken(), "token", 1024), capnp_body::text(r.getActor(), "actor", 256),
                           r.getOn()};
  });
}

struct lose_request {
  std::string token, type;
  int count = 0;
};

std::vector<std::uint8_t> encode_lose(const lose_request& r) {
  capnp::MallocMessageBuilder b;
  auto w = b.initRoot<wire::ControlLose>();
  w.setToken(r.token);
  w.setType(r.type);
  w.setCount(static_cast<std::uint32_t>(std::max(r.count, 0)));
  return capnp_body::flat(b);
}

caf::expected<lose_request> decode_lose(const std::vector<std::uint8_t>& body) {
  return capnp_body::decode<wire::ControlLose>(body, "ControlLose", [](wire::ControlLose::Reader r) {
    return lose_request{capnp_body::text(r.getToken(), "token", 1024), capnp_body::text(r.getType(), "type", 64),
                        static_cast<int>(std::min<std::uint32_t>(r.getCount(), 1u << 20))};
  });
}

/// Compares in time independent of where the strings differ.
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

caf::behavior control(caf::event_based_actor* self, std::shared_ptr<node_context> ctx, std::string token) {
  self->set_default_handler(caf::drop);
  return {
      [ctx, token](remote_message& m) -> caf::result<remote_message> {
        const auto refuse = [&](const char* what) {
          spdlog::warn("control: refused a {} from {}: wrong token", what,
                       m.from_node.empty() ? "this process" : m.from_node);
          return make_error(errc::auth_refused, "wrong control token");
        };
        remote_message ok;
        ok.type = control_msg::ok;
        if (m.type == control_msg::reshape) {
          auto r = decode_reshape(m.body);
          if (!r) return r.error();
          if (!same_token(r->token, token)) return refuse("reshape");
          if (auto err = reshape_links(*ctx, r->profile)) return err;
          return ok;
        }
        if (m.type == control_msg::partition) {
          auto r = decode_partition(m.body);
          if (!r) return r.error();
          if (!same_token(r->token, token)) return refuse("partition");
          if (r->on && m.from_node.empty())
            return make_error(errc::invalid_argument, "a partition is ordered over a link (its harness keeps it)");
          ctx->set_partition(r->on ? std::optional<std::string>(m.from_node) : std::nullopt);
          if (r->on)
            spdlog::warn("node {}: partitioned by {}: traffic with every other peer is dropped", ctx->node_id,
                         m.from_node);
          else
            spdlog::info("node {}: partition ended", ctx->node_id);
          return ok;
        }
        if (m.type == control_msg::corrupt) {
          auto r = decode_corrupt(m.body);
          if (!r) return r.error();
          if (!same_token(r->token, token)) return refuse("corrupt");
          auto target = ctx->directory.find(r->actor);
          if (!target)
            return make_error(errc::unknown_actor, "node " + ctx->node_id + " publishes no actor '" + r->actor + "'");
          // Sent before the answer: whatever the harness does after it
          // reaches the actor behind this.
          caf::anon_send(target, corrupt_atom::value, r->on);
          spdlog::warn("node {}: its '{}' actor {} on the harness's order", ctx->node_id, r->actor,
                       r->on ? "returns wrong outputs from now on" : "returns correct outputs again");
          return ok;
        }
        if (m.type == control_msg::stall) {
          auto r = decode_stall(m.body);
          if (!r) return r.error();
          if (!same_token(r->token, token)) return refuse("stall");
          auto target = ctx->directory.find(r->actor);
          if (!target)
            return make_error(errc::unknown_actor, "node " + ctx->node_id + " publishes no actor '" + r->actor + "'");
          caf::anon_send(target, stall_atom::value, r->on);
          spdlog::warn("node {}: the work its '{}' actor watches {} on the harness's order", ctx->node_id, r->actor,
                       r->on ? "stalls from now on" : "goes on again");
          return ok;
        }
        if (m.type == control_msg::lose) {
          auto r = decode_lose(m.body);
          if (!r) return r.error();
          if (!same_token(r->token, token)) return refuse("lose");
          auto target = ctx->directory.find("train");
          if (!target) return make_error(errc::unknown_actor, "node " + ctx->node_id + " runs no training rank");
          caf::anon_send(target, lose_atom::value, r->type, r->count);
          spdlog::warn("node {}: its training mailbox loses the next {} '{}' message(s) on the harness's order",
                       ctx->node_id, r->count, r->type);
          return ok;
        }
        return make_error(errc::bad_message, "the control actor answers '" + std::string(control_msg::reshape) +
                                                 "', '" + control_msg::partition + "', '" + control_msg::corrupt +
                                                 "', '" + control_msg::stall + "' and '" + control_msg::lose +
                                                 "', not '" + m.type + "'");
      },
  };
}

}  // namespace

caf::error reshape_links(node_context& ctx, const std::string& profile) {
  std::optional<net::link_profile> p;
  if (!profile.empty()) try {
      p = net::parse_link_profile(profile);
    } catch (const std::exception& e) {
      return make_error(errc::invalid_argument, "invalid link profile '" + profile + "': " + e.what());
    }
  ctx.set_reshaped(p);
  for (const auto& link : ctx.directory.links()) caf::anon_send(link, reshape_atom::value);
  spdlog::info("node {}: sends shaped {} from now on", ctx.node_id, p ? net::describe(*p) : "as each link was set up");
  return {};
}

caf::actor spawn_control_actor(caf::actor_system& system, std::shared_ptr<node_context> ctx, std::string token) {
  return system.spawn(control, std::move(ctx), std::move(token));
}

namespace {

caf::error request_control(node& n, const std::string& peer, remote_message m, std::chrono::milliseconds timeout) {
  auto r = n.request(peer, control_actor_name, std::move(m), timeout);
  if (!r) return r.error();
  if (r->type != control_msg::ok)
    return make_error(errc::bad_message, "the control actor of " + peer + " answered '" + r->type + "'");
  return {};
}

}  // namespace

caf::error request_reshape(node& n, const std::string& peer, const std::string& token, const std::string& profile,
                           std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::reshape;
  m.body = encode_reshape({token, profile});
  return request_control(n, peer, std::move(m), timeout);
}

caf::error request_partition(node& n, const std::string& peer, const std::string& token, bool on,
                             std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::partition;
  m.body = encode_partition({token, on});
  return request_control(n, peer, std::move(m), timeout);
}

caf::error request_corrupt(node& n, const std::string& peer, const std::string& token, const std::string& actor,
                           bool on, std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::corrupt;
  m.body = encode_corrupt({token, actor, on});
  return request_control(n, peer, std::move(m), timeout);
}

caf::error request_stall(node& n, const std::string& peer, const std::string& token, const std::string& actor, bool on,
                         std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::stall;
  m.body = encode_stall({token, actor, on});
  return request_control(n, peer, std::move(m), timeout);
}

caf::error request_lose(node& n, const std::string& peer, const std::string& token, const std::string& type, int count,
                        std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::lose;
  m.body = encode_lose({token, type, count});
  return request_control(n, peer, std::move(m), timeout);
}

}  // namespace corolla
