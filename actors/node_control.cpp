// A node's control actor (actors/node_control.hpp).
#include "actors/node_control.hpp"

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
        if (m.type != control_msg::reshape)
          return make_error(errc::bad_message, "the control actor answers '" + std::string(control_msg::reshape) +
                                                   "', not '" + m.type + "'");
        auto r = decode_reshape(m.body);
        if (!r) return r.error();
        if (!same_token(r->token, token)) {
          spdlog::warn("control: refused a reshape from {}: wrong token", m.from_node.empty() ? "this process" : m.from_node);
          return make_error(errc::auth_refused, "wrong control token");
        }
        if (auto err = reshape_links(*ctx, r->profile)) return err;
        remote_message ok;
        ok.type = control_msg::ok;
        return ok;
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

caf::error request_reshape(node& n, const std::string& peer, const std::string& token, const std::string& profile,
                           std::chrono::milliseconds timeout) {
  remote_message m;
  m.type = control_msg::reshape;
  m.body = encode_reshape({token, profile});
  auto r = n.request(peer, control_actor_name, std::move(m), timeout);
  if (!r) return r.error();
  if (r->type != control_msg::ok)
    return make_error(errc::bad_message, "the control actor of " + peer + " answered '" + r->type + "'");
  return {};
}

}  // namespace corolla
